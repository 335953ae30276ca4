//! The node's image cache directory, and when an entry in it may be trusted.
//!
//! An entry is named after the digest the sender announced, but its name proves nothing: a
//! user who can write into the cache could plant a same-named, same-sized image. So the
//! directory must be private to this user (owned by them, not group- or world-writable, every
//! ancestor owned by root or them and sticky where others may write), it is created 0700, and
//! a cache hit still counts only when its bytes hash to the sender's digest (read again, or
//! taken from a stamp of the same files: see [`super::stamp`]).

use super::StageError;
use super::layout::Layout;
use std::path::Path;

/// Why a cache directory is refused (the check is `vse-base`'s, shared with the build caches
/// and run directories).
pub type UnsafeCache = vse_base::Unsafe;

/// Creates `dir` (0700 for every component it makes) and checks that nobody but this user
/// (and root) can change what is in it.
pub fn prepare(dir: &Path) -> Result<(), StageError> {
    vse_base::private_dir(dir, "image cache (VSE_IMAGE_CACHE)").map_err(|e| match e {
        UnsafeCache::Io { path, source, .. } => StageError::Io(path, source),
        e => e.into(),
    })
}

/// True when `dir` holds exactly the image `digest` names: the files of `layout` with their
/// sizes, and their bytes hashing to `digest` (reads the whole image, unless its stamp says
/// the same files were read before).
pub(crate) fn holds(layout: &Layout, dir: &Path, digest: &str) -> bool {
    layout.present_in(dir)
        && super::stamp::table(layout, dir).is_ok_and(|t| layout.digest(&t) == digest)
}

/// Marks `taken` (the image a job boots) as just used and, in the background, keeps `cache`
/// within `limits`: its images and boot templates, least recently used first, never one a
/// process holds open (see [`vse_base::evict`]).
pub fn keep_within(cache: &Path, taken: &Path, limits: vse_base::evict::Limits) {
    let (cache, taken) = (cache.to_path_buf(), taken.to_path_buf());
    std::thread::spawn(move || {
        let templates = cache.join(".templates");
        let dirs = [cache.as_path(), templates.as_path()];
        for line in vse_base::evict::keep(&dirs, &taken, &limits) {
            eprintln!("image cache {line}");
        }
    });
}

/// Moves a cache entry that is not what its name says out of the way, then removes it (the
/// rename first, so no reader takes it for the image meanwhile).
pub(crate) fn discard(dir: &Path) -> Result<(), StageError> {
    if let Some(stamp) = super::stamp::path_of(dir) {
        let _ = std::fs::remove_file(stamp);
    }
    let mut name = std::ffi::OsString::from(".discarded-");
    name.push(dir.file_name().unwrap_or_default());
    name.push(format!("-{}", std::process::id()));
    let aside = dir.with_file_name(name);
    std::fs::rename(dir, &aside).map_err(|e| StageError::Io(dir.to_path_buf(), e))?;
    std::fs::remove_dir_all(&aside).map_err(|e| StageError::Io(aside, e))
}
