//! A template's files: checksums, sparse copies of overlays, the backing file's path, the
//! per-key save lock and the atomic publication.

use super::{FileSum, TemplateError, io};
use crate::spec::hex;
use sha2::Digest;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A name part no other call of this process uses.
pub(super) fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Size and SHA-256 of a file.
pub(super) fn sum(path: &Path) -> Result<FileSum, TemplateError> {
    let mut f = File::open(path).map_err(io("opening", path))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(FileSum {
        size,
        sha256: hex(&h.finalize()),
    })
}

/// Copies `src` to a new file `dst`, reading and writing only its data (holes stay holes).
pub(super) fn copy_sparse(src: &Path, dst: &Path) -> Result<(), TemplateError> {
    let from = File::open(src).map_err(io("opening", src))?;
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io("creating", dst))?;
    let len = from.metadata().map_err(io("reading", src))?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let Some((start, end)) = data_extent(&from, pos, len) else {
            break;
        };
        let mut at = start;
        while at < end {
            let n = (end - at).min(buf.len() as u64) as usize;
            from.read_exact_at(&mut buf[..n], at)
                .map_err(io("reading", src))?;
            to.write_all_at(&buf[..n], at).map_err(io("writing", dst))?;
            at += n as u64;
        }
        pos = end;
    }
    to.set_len(len).map_err(io("sizing", dst))?;
    to.sync_all().map_err(io("syncing", dst))
}

/// The next data extent at or after `pos`: SEEK_DATA/SEEK_HOLE, or the rest of the file
/// where the file system cannot tell.
fn data_extent(f: &File, pos: u64, len: u64) -> Option<(u64, u64)> {
    let fd = f.as_raw_fd();
    // SAFETY: lseek on our own open descriptor.
    let start = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
    if start < 0 {
        let e = std::io::Error::last_os_error();
        // ENXIO: no data after pos. Anything else: copy everything.
        return (e.raw_os_error() != Some(libc::ENXIO)).then_some((pos, len));
    }
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
    let end = if end < 0 { len } else { end as u64 };
    Some((start as u64, end.min(len)))
}

/// Points the overlay at `base` (this node's copy of the image's root disk) without touching
/// its data: both files hold the same image.
pub(super) fn rebase(overlay: &Path, base: &Path) -> Result<(), TemplateError> {
    let qemu_img = v2m::which::find_binary(Path::new("qemu-img")).ok_or_else(|| {
        TemplateError::Rebase("qemu-img not found (apt-get install qemu-utils)".into())
    })?;
    let out = std::process::Command::new(qemu_img)
        .args(["rebase", "-u", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay)
        .output()
        .map_err(|e| TemplateError::Rebase(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TemplateError::Rebase(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// The advisory lock of one key's save: held by one VM at a time on this node (flock, so a
/// crashed saver releases it), `None` when another holds it.
pub(super) fn try_lock(path: &Path) -> Result<Option<File>, TemplateError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("opening the lock", path))?;
    // SAFETY: flock on our own open descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok((rc == 0).then_some(f))
}

/// A directory only this user may enter (the cache holds this user's VM memory).
pub(super) fn private_dir(path: &Path) -> Result<(), TemplateError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io("creating", path))
}

/// Removes what a saver of `key` killed mid-way left (its `.tmp-<key>-…` directory): only
/// called under the key's lock, so no such directory is in use.
pub(super) fn sweep_unfinished(dir: &Path, key: &str) {
    let prefix = format!(".tmp-{key}-");
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Renames the finished `tmp` to `dst`: false (and `tmp` removed) when another process
/// published the same key first.
pub(super) fn publish(tmp: &Path, dst: &Path) -> Result<bool, TemplateError> {
    if let Ok(d) = File::open(tmp) {
        let _ = d.sync_all();
    }
    match std::fs::rename(tmp, dst) {
        Ok(()) => {
            if let Some(parent) = dst.parent().and_then(|p| File::open(p).ok()) {
                let _ = parent.sync_all();
            }
            Ok(true)
        }
        Err(_) if dst.is_dir() => {
            let _ = std::fs::remove_dir_all(tmp);
            Ok(false)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(tmp);
            Err(io("publishing the template", dst)(e))
        }
    }
}

/// A temporary directory inside `dir` for building one template, removed on drop unless
/// published.
pub(super) struct Building {
    pub path: PathBuf,
}

impl Building {
    pub fn new(dir: &Path, key: &str) -> Result<Self, TemplateError> {
        let path = dir.join(format!(".tmp-{key}-{}-{}", std::process::id(), unique()));
        private_dir(&path)?;
        Ok(Building { path })
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
