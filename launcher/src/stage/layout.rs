//! An image directory seen as one byte stream: its regular files in name order, concatenated.
//! Chunks are fixed-size slices of that stream; the image digest is SHA-256 over every file's
//! name, size and content, so two nodes agree on "the same image" without trusting file dates.

use super::StageError;
use sha2::{Digest, Sha256};
use std::{fs::File, os::unix::fs::FileExt, path::Path};

/// Default chunk size: large enough that per-frame costs vanish, small enough to pipeline.
pub const DEFAULT_CHUNK: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// (name, size, offset of the file's first byte in the stream)
    files: Vec<(String, u64, u64)>,
    total: u64,
    chunk: u64,
}

/// A file name an image may contain: one plain path component, so a hostile offer cannot
/// write outside the cache (`../x`, `/etc/x`) or hide a file (`.x`).
pub fn check_name(name: &str) -> Result<(), StageError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\0', '\\']);
    if ok {
        Ok(())
    } else {
        Err(StageError::BadOffer(format!(
            "file name {name:?}: expected one plain path component (no '/', not starting with '.')"
        )))
    }
}

impl Layout {
    pub fn new(mut files: Vec<(String, u64)>, chunk: u64) -> Result<Self, StageError> {
        if chunk == 0 || chunk > agents::proto::MAX_BLOB as u64 {
            return Err(StageError::BadOffer(format!(
                "chunk size {chunk}: expected 1..={}",
                agents::proto::MAX_BLOB
            )));
        }
        files.sort();
        let mut out = Vec::with_capacity(files.len());
        let mut off = 0u64;
        for (i, (name, size)) in files.iter().enumerate() {
            check_name(name)?;
            if i > 0 && files[i - 1].0 == *name {
                return Err(StageError::BadOffer(format!("file {name:?} listed twice")));
            }
            out.push((name.clone(), *size, off));
            off = off
                .checked_add(*size)
                .ok_or_else(|| StageError::BadOffer("image size overflows".into()))?;
        }
        Ok(Self {
            files: out,
            total: off,
            chunk,
        })
    }

    /// The regular files directly inside `dir` (an image written by `vse build`).
    pub fn from_dir(dir: &Path, chunk: u64) -> Result<Self, StageError> {
        let io = |e| StageError::Io(dir.to_path_buf(), e);
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let meta = entry.metadata().map_err(io)?;
            if name.starts_with('.') {
                continue;
            }
            if !meta.is_file() {
                return Err(StageError::BadImage(format!(
                    "{}: only regular files can be staged; hint: an image directory from `vse build` is flat",
                    entry.path().display()
                )));
            }
            files.push((name, meta.len()));
        }
        if files.is_empty() {
            return Err(StageError::BadImage(format!(
                "{}: no files to stage; expected an image directory from `vse build`",
                dir.display()
            )));
        }
        Self::new(files, chunk)
    }

    pub fn files(&self) -> Vec<(String, u64)> {
        self.files.iter().map(|(n, s, _)| (n.clone(), *s)).collect()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    pub fn count(&self) -> u64 {
        self.total.div_ceil(self.chunk)
    }

    /// Byte range of chunk `i` in the stream.
    pub fn chunk_range(&self, i: u64) -> (u64, u64) {
        let start = i * self.chunk;
        (start, (start + self.chunk).min(self.total))
    }

    /// The pieces of stream range `[start, end)`: (file index, offset in file, length).
    fn pieces(&self, start: u64, end: u64) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        self.files
            .iter()
            .enumerate()
            .filter(move |(_, (_, size, off))| *off < end && off + size > start)
            .map(move |(i, (_, size, off))| {
                let a = start.max(*off);
                let b = end.min(off + size);
                (i, a - off, b - a)
            })
    }

    pub fn open_all(&self, dir: &Path, write: bool) -> Result<Vec<File>, StageError> {
        self.files
            .iter()
            .map(|(name, size, _)| {
                let p = dir.join(name);
                let f = if write {
                    let f = File::options()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&p);
                    f.and_then(|f| f.set_len(*size).map(|_| f))
                } else {
                    File::open(&p)
                };
                f.map_err(|e| StageError::Io(p, e))
            })
            .collect()
    }

    pub fn read_chunk(&self, files: &[File], i: u64, dir: &Path) -> Result<Vec<u8>, StageError> {
        let (start, end) = self.chunk_range(i);
        let mut out = vec![0u8; (end - start) as usize];
        let mut at = 0usize;
        for (fi, off, len) in self.pieces(start, end) {
            let buf = &mut out[at..at + len as usize];
            files[fi]
                .read_exact_at(buf, off)
                .map_err(|e| StageError::Io(dir.join(&self.files[fi].0), e))?;
            at += len as usize;
        }
        Ok(out)
    }

    pub fn write_chunk(
        &self,
        files: &[File],
        i: u64,
        data: &[u8],
        dir: &Path,
    ) -> Result<(), StageError> {
        let (start, end) = self.chunk_range(i);
        if data.len() as u64 != end - start {
            return Err(StageError::Corrupt(format!(
                "chunk {i} has {} bytes, expected {}",
                data.len(),
                end - start
            )));
        }
        let mut at = 0usize;
        for (fi, off, len) in self.pieces(start, end) {
            files[fi]
                .write_all_at(&data[at..at + len as usize], off)
                .map_err(|e| StageError::Io(dir.join(&self.files[fi].0), e))?;
            at += len as usize;
        }
        Ok(())
    }

    /// True when `dir` holds every file of this layout with its size (a cache hit candidate).
    pub fn present_in(&self, dir: &Path) -> bool {
        self.files.iter().all(|(n, s, _)| {
            std::fs::metadata(dir.join(n)).is_ok_and(|m| m.is_file() && m.len() == *s)
        })
    }

    /// Digest of the image in `dir`, reading it once.
    pub fn digest_of(&self, dir: &Path) -> Result<String, StageError> {
        let files = self.open_all(dir, false)?;
        let mut h = StreamHasher::new(self);
        for i in 0..self.count() {
            h.feed(self, &self.read_chunk(&files, i, dir)?);
        }
        Ok(h.finish(self))
    }
}

/// The image digest computed incrementally over the stream, chunk after chunk in order.
pub struct StreamHasher {
    h: Sha256,
    pos: u64,
    headers: usize,
}

impl StreamHasher {
    pub fn new(_l: &Layout) -> Self {
        Self {
            h: Sha256::new(),
            pos: 0,
            headers: 0,
        }
    }

    /// Hashes the headers of every file starting at or before `pos` (in name order, which is
    /// stream order, so empty files land between their neighbours).
    fn headers_up_to(&mut self, l: &Layout, pos: u64) {
        while let Some((name, size, _)) = l.files.get(self.headers).filter(|f| f.2 <= pos) {
            self.h.update(name.as_bytes());
            self.h.update([0u8]);
            self.h.update(size.to_be_bytes());
            self.headers += 1;
        }
    }

    pub fn feed(&mut self, l: &Layout, mut data: &[u8]) {
        while !data.is_empty() {
            self.headers_up_to(l, self.pos);
            // Feed up to the next file boundary, so the next header lands in its place.
            let next_start = l
                .files
                .get(self.headers)
                .map_or(u64::MAX, |(_, _, off)| *off);
            let n = ((next_start - self.pos) as usize).min(data.len());
            self.h.update(&data[..n]);
            self.pos += n as u64;
            data = &data[n..];
        }
    }

    pub fn finish(mut self, l: &Layout) -> String {
        self.headers_up_to(l, u64::MAX);
        hex::encode(self.h.finalize())
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(files: &[(&str, u64)], chunk: u64) -> Layout {
        Layout::new(
            files.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            chunk,
        )
        .unwrap()
    }

    #[test]
    fn chunks_cross_file_boundaries_and_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"hello").unwrap();
        std::fs::write(d.path().join("b"), b"").unwrap();
        std::fs::write(d.path().join("c"), b"world!!").unwrap();
        let l = Layout::from_dir(d.path(), 4).unwrap();
        assert_eq!((l.total(), l.count()), (12, 3));
        let src = l.open_all(d.path(), false).unwrap();
        let out = tempfile::tempdir().unwrap();
        let dst = l.open_all(out.path(), true).unwrap();
        let mut h = StreamHasher::new(&l);
        for i in 0..l.count() {
            let c = l.read_chunk(&src, i, d.path()).unwrap();
            h.feed(&l, &c);
            l.write_chunk(&dst, i, &c, out.path()).unwrap();
        }
        assert_eq!(std::fs::read(out.path().join("c")).unwrap(), b"world!!");
        assert_eq!(h.finish(&l), l.digest_of(d.path()).unwrap());
        // chunking does not change the digest
        let l2 = Layout::from_dir(d.path(), 5).unwrap();
        assert_eq!(
            l2.digest_of(d.path()).unwrap(),
            l.digest_of(d.path()).unwrap()
        );
    }

    #[test]
    fn digest_binds_names_and_boundaries() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"ab").unwrap();
        std::fs::write(d.path().join("b"), b"c").unwrap();
        let one = Layout::from_dir(d.path(), 2)
            .unwrap()
            .digest_of(d.path())
            .unwrap();
        std::fs::write(d.path().join("a"), b"a").unwrap();
        std::fs::write(d.path().join("b"), b"bc").unwrap();
        let two = Layout::from_dir(d.path(), 2)
            .unwrap()
            .digest_of(d.path())
            .unwrap();
        assert_ne!(one, two, "same bytes, different file boundaries");
        let empty_tail = layout(&[("a", 1), ("z", 0)], 4);
        let no_tail = layout(&[("a", 1)], 4);
        let mut h1 = StreamHasher::new(&empty_tail);
        h1.feed(&empty_tail, b"x");
        let mut h2 = StreamHasher::new(&no_tail);
        h2.feed(&no_tail, b"x");
        assert_ne!(h1.finish(&empty_tail), h2.finish(&no_tail));
    }

    #[test]
    fn hostile_names_rejected() {
        for bad in ["../x", "/etc/passwd", ".hidden", "", "a/b"] {
            assert!(Layout::new(vec![(bad.into(), 1)], 4).is_err(), "{bad}");
        }
        assert!(Layout::new(vec![("a".into(), 1), ("a".into(), 2)], 4).is_err());
        assert!(Layout::new(vec![("a".into(), 1)], 0).is_err());
    }
}
