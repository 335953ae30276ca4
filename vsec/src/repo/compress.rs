//! Decompression of index files: `.xz`, `.gz`, `.lz4` (apt's own lz4 frames, as found in
//! `/var/lib/apt/lists` when `Acquire::GzipIndexes` is on) and plain.

use std::io::Read;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Xz,
    Lz4,
}

impl Compression {
    /// From a file name's extension; anything unknown is taken as uncompressed.
    pub fn from_name(name: &str) -> Compression {
        if name.ends_with(".xz") {
            Compression::Xz
        } else if name.ends_with(".gz") {
            Compression::Gzip
        } else if name.ends_with(".lz4") {
            Compression::Lz4
        } else {
            Compression::None
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => ".gz",
            Compression::Xz => ".xz",
            Compression::Lz4 => ".lz4",
        }
    }
}

/// Most memory the `.xz` decoder may use (dictionary and buffers).
const XZ_MEMLIMIT: u64 = 256 << 20;

/// Decompresses `data` entirely. Errors carry the decoder's message (truncation shows up here).
pub fn decompress(data: &[u8], c: Compression) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() * 4);
    match c {
        Compression::None => out.extend_from_slice(data),
        Compression::Gzip => {
            flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out)?;
        }
        Compression::Xz => {
            // `.xz` streams only, with bounded decoder memory. (`new_multi_decoder` also takes
            // legacy `.lzma`, whose 13-byte header alone can ask for a 4 GiB dictionary, with
            // no memory limit.) `xz -9` needs 65 MiB to decode.
            let stream =
                xz2::stream::Stream::new_stream_decoder(XZ_MEMLIMIT, xz2::stream::CONCATENATED)
                    .map_err(std::io::Error::other)?;
            xz2::read::XzDecoder::new_stream(data, stream).read_to_end(&mut out)?;
        }
        Compression::Lz4 => {
            lz4_flex::frame::FrameDecoder::new(data).read_to_end(&mut out)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn round_trips_and_detects_truncation() {
        let text = b"Package: a\nVersion: 1\n".repeat(200);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&text).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(decompress(&gz, Compression::Gzip).unwrap(), text);
        let mut xz = xz2::write::XzEncoder::new(Vec::new(), 6);
        xz.write_all(&text).unwrap();
        let xz = xz.finish().unwrap();
        assert_eq!(decompress(&xz, Compression::Xz).unwrap(), text);
        let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
        lz.write_all(&text).unwrap();
        let lz = lz.finish().unwrap();
        assert_eq!(decompress(&lz, Compression::Lz4).unwrap(), text);
        for (data, c) in [(&xz, Compression::Xz), (&gz, Compression::Gzip)] {
            assert!(decompress(&data[..data.len() / 2], c).is_err(), "{c:?}");
        }
        assert_eq!(Compression::from_name("x_Packages.lz4"), Compression::Lz4);
    }

    /// Fuzzing found it (fuzz/corpus/debian_index/regress-lzma-4g-dictionary): a 50-byte
    /// legacy `.lzma` header declaring a 4 GiB dictionary made the decoder allocate 4 GiB.
    #[test]
    fn xz_refuses_lzma_alone_and_huge_dictionaries() {
        // Arrange: an LZMA_Alone header (props, dictionary size 0xffffffff, unknown size).
        let mut alone = vec![0x5d, 0xff, 0xff, 0xff, 0xff];
        alone.extend_from_slice(&[0xff; 8]);
        alone.extend_from_slice(&[0; 32]);

        // Act
        let r = decompress(&alone, Compression::Xz);

        // Assert
        assert!(r.is_err());
    }
}
