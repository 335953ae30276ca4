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

    /// The image's files, in stream order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(n, _, _)| n.as_str())
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
                    // A fresh file of the right length is one hole: chunks land at their
                    // offsets and what is never written stays unallocated.
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

    /// Length of chunk `i` in bytes.
    pub fn chunk_len(&self, i: u64) -> usize {
        let (a, b) = self.chunk_range(i);
        (b - a) as usize
    }

    /// Chunk `i`'s bytes, or `None` when they are all zero (a hole: never sent, never
    /// written). Ranges the file system reports as holes (SEEK_DATA) are not read at all.
    pub fn read_chunk(
        &self,
        files: &[File],
        i: u64,
        dir: &Path,
    ) -> Result<Option<Vec<u8>>, StageError> {
        let (start, end) = self.chunk_range(i);
        let io = |fi: usize| {
            let p = dir.join(&self.files[fi].0);
            move |e| StageError::Io(p, e)
        };
        let mut any_data = false;
        for (fi, off, len) in self.pieces(start, end) {
            if has_data(&files[fi], off, len).map_err(io(fi))? {
                any_data = true;
                break;
            }
        }
        if !any_data {
            return Ok(None);
        }
        let mut out = vec![0u8; (end - start) as usize];
        let mut at = 0usize;
        for (fi, off, len) in self.pieces(start, end) {
            let buf = &mut out[at..at + len as usize];
            files[fi].read_exact_at(buf, off).map_err(io(fi))?;
            at += len as usize;
        }
        Ok((!is_zero(&out)).then_some(out))
    }

    /// Writes chunk `i` at its offsets, leaving every all-zero block of the file a hole (the
    /// files were created empty at their full length), in one write per run of data blocks.
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
            let piece = &data[at..at + len as usize];
            for (a, b) in data_runs(off, piece) {
                files[fi]
                    .write_all_at(&piece[a..b], off + a as u64)
                    .map_err(|e| StageError::Io(dir.join(&self.files[fi].0), e))?;
            }
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

    /// Every chunk's hash in `dir` (holes skipped without reading), reading the image once.
    pub fn table_of(&self, dir: &Path) -> Result<Vec<ChunkHash>, StageError> {
        let files = self.open_all(dir, false)?;
        (0..self.count())
            .map(|i| Ok(self.read_chunk(&files, i, dir)?.map(|d| sha256(&d))))
            .collect()
    }

    /// The image digest: SHA-256 over the chunk size, every file's name and size, and every
    /// chunk's hash (a hole being all zeros). It follows from the chunk hashes, so neither end
    /// hashes the content twice, and holes cost nothing.
    pub fn digest(&self, table: &[ChunkHash]) -> String {
        let mut h = Sha256::new();
        h.update(b"vse-stage-image-v2\0");
        h.update(self.chunk.to_be_bytes());
        h.update((self.files.len() as u64).to_be_bytes());
        for (name, size, _) in &self.files {
            h.update(name.as_bytes());
            h.update([0u8]);
            h.update(size.to_be_bytes());
        }
        h.update((table.len() as u64).to_be_bytes());
        for c in table {
            match c {
                None => h.update([0u8]),
                Some(x) => {
                    h.update([1u8]);
                    h.update(x);
                }
            }
        }
        hex::encode(h.finalize())
    }

    /// Digest of the image in `dir`, reading it once.
    pub fn digest_of(&self, dir: &Path) -> Result<String, StageError> {
        Ok(self.digest(&self.table_of(dir)?))
    }
}

/// A chunk's SHA-256, or `None` for a chunk of zeros (a hole).
pub type ChunkHash = Option<[u8; 32]>;

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The block size below which zeros are written rather than left as holes.
const BLOCK: u64 = 4096;

pub(crate) fn is_zero(data: &[u8]) -> bool {
    // OR-folding fixed blocks vectorises; `all(|b| b == 0)` stops per byte.
    let mut blocks = data.chunks_exact(BLOCK as usize);
    blocks.all(|b| b.iter().fold(0u8, |a, x| a | x) == 0)
        && blocks.remainder().iter().all(|b| *b == 0)
}

/// Ranges of `piece` (which starts at file offset `off`) to write: runs of file blocks that
/// are not all zero, so zero blocks stay holes.
fn data_runs(off: u64, piece: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut a = 0usize;
    while a < piece.len() {
        // Block boundaries are file offsets, not piece offsets.
        let b = (((off + a as u64) / BLOCK + 1) * BLOCK - off).min(piece.len() as u64) as usize;
        if !is_zero(&piece[a..b]) {
            match runs.last_mut() {
                Some(r) if r.1 == a => r.1 = b,
                _ => runs.push((a, b)),
            }
        }
        a = b;
    }
    runs
}

/// Whether `[off, off+len)` of `f` may hold data: false only when the file system says the
/// whole range is a hole.
fn has_data(f: &File, off: u64, len: u64) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(false);
    }
    // SAFETY: lseek on an open descriptor has no memory effects; it moves the file offset,
    // which this module never uses (all I/O is positional).
    let at = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    if at < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            // No data at or after `off`.
            Some(libc::ENXIO) => Ok(false),
            // A file system without SEEK_DATA: read everything.
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(true),
            _ => Err(e),
        };
    }
    Ok((at as u64) < off + len)
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
        for i in 0..l.count() {
            let c = l.read_chunk(&src, i, d.path()).unwrap().unwrap();
            l.write_chunk(&dst, i, &c, out.path()).unwrap();
        }
        assert_eq!(std::fs::read(out.path().join("c")).unwrap(), b"world!!");
        assert_eq!(
            l.digest_of(out.path()).unwrap(),
            l.digest_of(d.path()).unwrap()
        );
    }

    #[test]
    fn zero_chunks_are_holes_and_stay_holes() {
        let d = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 64 << 10];
        data[5000] = 1; // chunk 0 (16 KiB chunks) has data in its second block only
        data[40 << 10] = 2; // chunk 2
        std::fs::write(d.path().join("root"), &data).unwrap();
        let l = Layout::from_dir(d.path(), 16 << 10).unwrap();
        let t = l.table_of(d.path()).unwrap();
        let holes: Vec<bool> = t.iter().map(Option::is_none).collect();
        assert_eq!(holes, [false, true, false, true]);
        assert_eq!(data_runs(0, &data[..16 << 10]), vec![(4096, 8192)]);
        // A block boundary is a file offset: a piece starting mid-block is cut there.
        assert_eq!(data_runs(100, &data[..8192]), vec![(3996, 8092)]);
        let out = tempfile::tempdir().unwrap();
        let dst = l.open_all(out.path(), true).unwrap();
        let src = l.open_all(d.path(), false).unwrap();
        for i in 0..l.count() {
            if let Some(c) = l.read_chunk(&src, i, d.path()).unwrap() {
                l.write_chunk(&dst, i, &c, out.path()).unwrap();
            }
        }
        assert_eq!(std::fs::read(out.path().join("root")).unwrap(), data);
        assert_eq!(l.digest_of(out.path()).unwrap(), l.digest(&t));
    }

    #[test]
    fn digest_binds_names_boundaries_and_holes() {
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
        let x = Some(sha256(b"x"));
        assert_ne!(empty_tail.digest(&[x]), no_tail.digest(&[x]));
        let l = layout(&[("a", 8)], 4);
        assert_ne!(
            l.digest(&[None, x]),
            l.digest(&[x, None]),
            "holes are placed"
        );
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
