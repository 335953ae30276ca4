//! The node's image cache directory, and when an entry in it may be trusted.
//!
//! An entry is named after the digest the sender announced, but its name proves nothing: a
//! user who can write into the cache could plant a same-named, same-sized image. So the
//! directory must be private to this user (owned by them, not group- or world-writable, every
//! ancestor owned by root or them and sticky where others may write), it is created 0700, and
//! a cache hit still counts only after its bytes hash to the sender's digest.

use super::StageError;
use super::layout::Layout;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a cache directory is refused; the text names the directory and the fix.
#[derive(Debug, thiserror::Error)]
pub enum UnsafeCache {
    #[error(
        "image cache {}: owned by uid {owner}, not by this user (uid {me}); hint: use a directory of your own (VSE_IMAGE_CACHE) or `chown {me} {}`",
        .dir.display(), .dir.display()
    )]
    Owner { dir: PathBuf, owner: u32, me: u32 },
    #[error(
        "image cache {}: mode {mode:04o} lets other users write into it; hint: `chmod 0700 {}`",
        .dir.display(), .dir.display()
    )]
    Writable { dir: PathBuf, mode: u32 },
    #[error(
        "image cache {}: its parent {} (uid {owner}, mode {mode:04o}) can be changed by another user, who could swap the cache; hint: put the cache under a directory owned by root or you (VSE_IMAGE_CACHE)",
        .dir.display(), .ancestor.display()
    )]
    Ancestor {
        dir: PathBuf,
        ancestor: PathBuf,
        owner: u32,
        mode: u32,
    },
}

/// Creates `dir` (0700 for every component it makes) and checks that nobody but this user
/// (and root) can change what is in it.
pub fn prepare(dir: &Path) -> Result<(), StageError> {
    let io = |e| StageError::Io(dir.to_path_buf(), e);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let real = dir.canonicalize().map_err(io)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let meta = std::fs::metadata(&real).map_err(io)?;
    let dir = dir.to_path_buf();
    if meta.uid() != me {
        return Err(UnsafeCache::Owner {
            dir,
            owner: meta.uid(),
            me,
        }
        .into());
    }
    if meta.mode() & 0o022 != 0 {
        let mode = meta.mode() & 0o7777;
        return Err(UnsafeCache::Writable { dir, mode }.into());
    }
    for ancestor in real.ancestors().skip(1) {
        let m = std::fs::metadata(ancestor).map_err(io)?;
        let mode = m.mode() & 0o7777;
        let owner_ok = m.uid() == 0 || m.uid() == me;
        // Others may add entries to a sticky directory (/tmp, /var/tmp) but not replace ours.
        let shared_ok = mode & 0o022 == 0 || mode & 0o1000 != 0;
        if !owner_ok || !shared_ok {
            return Err(UnsafeCache::Ancestor {
                dir,
                ancestor: ancestor.to_path_buf(),
                owner: m.uid(),
                mode,
            }
            .into());
        }
    }
    Ok(())
}

/// True when `dir` holds exactly the image `digest` names: the files of `layout` with their
/// sizes, and their bytes hashing to `digest` (reads the whole image, unless its stamp says
/// the same files were read before).
pub(crate) fn holds(layout: &Layout, dir: &Path, digest: &str) -> bool {
    layout.present_in(dir)
        && super::stamp::table(layout, dir).is_ok_and(|t| layout.digest(&t) == digest)
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
