//! A template's files: checksums and sparse copies (through [`crate::files`]), the per-key
//! save lock and the atomic publication.

use super::{FileSum, TemplateError, io};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A name part no other call of this process uses.
pub(super) fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Size and SHA-256 of a template file.
pub(super) fn sum(path: &Path) -> Result<FileSum, TemplateError> {
    let (size, sha256) = crate::files::hash_file(path).map_err(io("reading", path))?;
    Ok(FileSum { size, sha256 })
}

/// A sparse copy of an overlay, and its size and SHA-256.
pub(super) fn copy_sparse(src: &Path, dst: &Path) -> Result<FileSum, TemplateError> {
    let (size, sha256) = crate::files::copy_sparse(src, dst).map_err(io("copying to", dst))?;
    Ok(FileSum { size, sha256 })
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
    Ok(f.try_lock().is_ok().then_some(f))
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
