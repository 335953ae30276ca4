//! The files a VM is saved into or started from (saved states, disk overlays of job
//! checkpoints and boot templates): their size and SHA-256, and sparse copies hashed in the
//! same pass.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

const CHUNK: usize = 1 << 20;

/// Size and SHA-256 (hex) of a file's contents.
pub fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let got = f.read(&mut buf)?;
        if got == 0 {
            break;
        }
        h.update(&buf[..got]);
        n += got as u64;
    }
    Ok((n, hex(&h.finalize())))
}

/// Copies `src` to a new file `dst` (never over an existing one) and returns the size and
/// SHA-256 of the contents. Holes are neither read (SEEK_DATA/SEEK_HOLE) nor written, and an
/// all-zero chunk of data is left a hole too. `dst` is synced before this returns.
pub fn copy_sparse(src: &Path, dst: &Path) -> std::io::Result<(u64, String)> {
    let from = File::open(src)?;
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)?;
    let len = from.metadata()?.len();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let zeros = vec![0u8; CHUNK];
    let hash_zeros = |h: &mut Sha256, mut n: u64| {
        while n > 0 {
            let k = n.min(CHUNK as u64) as usize;
            h.update(&zeros[..k]);
            n -= k as u64;
        }
    };
    let mut pos = 0u64;
    while pos < len {
        let (start, end) = data_extent(&from, pos, len).unwrap_or((len, len));
        hash_zeros(&mut h, start - pos);
        let mut at = start;
        while at < end {
            let n = (end - at).min(CHUNK as u64) as usize;
            from.read_exact_at(&mut buf[..n], at)?;
            h.update(&buf[..n]);
            if buf[..n].iter().any(|&b| b != 0) {
                to.write_all_at(&buf[..n], at)?;
            }
            at += n as u64;
        }
        pos = end;
    }
    // A trailing hole still counts in the length.
    to.set_len(len)?;
    to.sync_all()?;
    Ok((len, hex(&h.finalize())))
}

/// The next data extent at or after `pos`; `None` when only a hole is left. Where the file
/// system cannot tell, the rest of the file is data.
fn data_extent(f: &File, pos: u64, len: u64) -> Option<(u64, u64)> {
    let fd = f.as_raw_fd();
    // SAFETY: lseek on our own open descriptor.
    let start = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
    if start < 0 {
        let e = std::io::Error::last_os_error();
        // ENXIO: no data after pos.
        return (e.raw_os_error() != Some(libc::ENXIO)).then_some((pos, len));
    }
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
    let end = if end < 0 { len } else { end as u64 };
    Some(((start as u64).min(len), end.min(len)))
}

/// Syncs a directory, so the names created or renamed in it are durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn hex(bytes: &[u8]) -> String {
    crate::spec::hex(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_copy_keeps_contents_and_holes_and_its_hash_is_the_files() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let f = File::create(&src).unwrap();
        f.set_len(12 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&[0u8; CHUNK], 4 << 20).unwrap();
        f.write_all_at(b"tail", 8 << 20).unwrap();
        drop(f);
        let dst = t.path().join("dst");
        let (n, sum) = copy_sparse(&src, &dst).unwrap();
        assert_eq!(n, 12 << 20);
        assert_eq!((n, sum.clone()), hash_file(&src).unwrap());
        assert_eq!(hash_file(&dst).unwrap(), (n, sum));
        // Two chunks hold data; the written zeros and the rest are holes.
        let used = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(used <= 3 << 20, "{used} bytes allocated");
        assert!(
            copy_sparse(&src, &dst).is_err(),
            "an existing file is never overwritten"
        );
    }
}
