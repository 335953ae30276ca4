//! Reading and copying checkpoint files with their SHA256: a disk overlay is copied sparse
//! (its unallocated ranges stay holes) and hashed in the same pass.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

const CHUNK: usize = 1 << 20;

/// Size and SHA256 (hex) of a file's contents.
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
    Ok((n, hex::encode(h.finalize())))
}

/// Copies `src` to a new file `dst`, leaving holes where `src` reads as zeros, and returns the
/// size and SHA256 of what was copied. `dst` is synced before this returns.
pub fn copy_sparse(src: &Path, dst: &Path) -> std::io::Result<(u64, String)> {
    let mut from = File::open(src)?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let got = read_full(&mut from, &mut buf)?;
        if got == 0 {
            break;
        }
        let chunk = &buf[..got];
        h.update(chunk);
        if chunk.iter().all(|&b| b == 0) {
            to.seek(SeekFrom::Current(got as i64))?;
        } else {
            to.write_all(chunk)?;
        }
        n += got as u64;
    }
    // A trailing hole still has to count in the length.
    to.set_len(n)?;
    to.sync_all()?;
    Ok((n, hex::encode(h.finalize())))
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Syncs a directory, so the names created or renamed in it are durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_copy_keeps_contents_and_holes() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let mut f = File::create(&src).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        f.set_len(12 << 20).unwrap();
        drop(f);
        let dst = t.path().join("dst");
        let (n, sum) = copy_sparse(&src, &dst).unwrap();
        assert_eq!(n, 12 << 20);
        assert_eq!((n, sum.clone()), hash_file(&src).unwrap());
        assert_eq!(hash_file(&dst).unwrap(), (n, sum));
        // Two 1 MiB chunks hold data; the other ten are holes.
        let used = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(used <= 3 << 20, "{used} bytes allocated");
        assert!(
            copy_sparse(&src, &dst).is_err(),
            "an existing file is never overwritten"
        );
    }
}
