//! A chunk as it travels: compressed with zstd when that saves enough, raw otherwise. The
//! encoding is chosen once, at the source; relays forward the bytes they received, and every
//! node checks what the bytes decode to against the chunk's hash from the offer.

use super::StageError;
use super::layout::{ChunkHash, sha256};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Raw,
    Zstd,
}

/// One data chunk in its wire form.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub encoding: Encoding,
    pub bytes: Vec<u8>,
}

/// Compressed output must be at least this much smaller than the input to be sent: below it,
/// the receivers' decompression costs more than the bytes saved.
const MIN_SAVING: usize = 16;

/// Encodes `data` at zstd `level` (None: raw).
pub(crate) fn encode(data: Vec<u8>, level: Option<i32>) -> Encoded {
    if let Some(level) = level
        && let Ok(c) = zstd::bulk::compress(&data, level)
        && c.len() < data.len() - data.len() / MIN_SAVING
    {
        return Encoded {
            encoding: Encoding::Zstd,
            bytes: c,
        };
    }
    Encoded {
        encoding: Encoding::Raw,
        bytes: data,
    }
}

/// Decodes chunk `index` into exactly `len` bytes and checks them against `want`.
pub(crate) fn decode(
    index: u64,
    encoding: Encoding,
    bytes: &[u8],
    len: usize,
    want: &ChunkHash,
) -> Result<Vec<u8>, StageError> {
    let Some(want) = want else {
        return Err(StageError::Corrupt(format!(
            "chunk {index} sent, but the offer says it is a hole"
        )));
    };
    let data = match encoding {
        Encoding::Raw => bytes.to_vec(),
        // The capacity bounds what a hostile frame can make us allocate.
        Encoding::Zstd => zstd::bulk::decompress(bytes, len).map_err(|e| {
            StageError::Corrupt(format!("chunk {index}: not a valid zstd frame: {e}"))
        })?,
    };
    if data.len() != len {
        return Err(StageError::Corrupt(format!(
            "chunk {index} has {} bytes, expected {len}",
            data.len()
        )));
    }
    let got = sha256(&data);
    if got != *want {
        return Err(StageError::Corrupt(format!(
            "chunk {index}: SHA-256 {}, the offer says {}",
            hex::encode(got),
            hex::encode(want)
        )));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_chunks_are_compressed_and_random_ones_are_not() {
        let text = b"vse ".repeat(4096);
        let e = encode(text.clone(), Some(1));
        assert_eq!(e.encoding, Encoding::Zstd);
        assert!(e.bytes.len() < text.len() / 10);
        let h = Some(sha256(&text));
        assert_eq!(
            decode(0, e.encoding, &e.bytes, text.len(), &h).unwrap(),
            text
        );
        let mut x = 1u64;
        let noise: Vec<u8> = (0..16384)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 56) as u8
            })
            .collect();
        assert_eq!(encode(noise.clone(), Some(3)).encoding, Encoding::Raw);
        assert_eq!(encode(text.clone(), None).encoding, Encoding::Raw);
        // Bytes that decompress to something else, or to more than the chunk, are refused.
        let other = zstd::bulk::compress(&b"evil".repeat(4096), 1).unwrap();
        assert!(decode(0, Encoding::Zstd, &other, text.len(), &h).is_err());
        let big = zstd::bulk::compress(&b"vse ".repeat(8192), 1).unwrap();
        assert!(decode(0, Encoding::Zstd, &big, text.len(), &h).is_err());
        assert!(decode(0, Encoding::Raw, &text, text.len(), &None).is_err());
    }
}
