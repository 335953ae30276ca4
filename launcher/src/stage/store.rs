//! One image on one node while it is staged: the open files, how many chunks are readable
//! (senders wait on that to forward while still receiving), and the incremental digest.

use super::{
    StageError,
    layout::{Layout, StreamHasher, sha256_hex},
};
use crate::sync::lock;
use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::Mutex,
};
use tokio::sync::watch;

pub(crate) struct Store {
    pub layout: Layout,
    pub digest: String,
    files: Vec<File>,
    /// Where the files are now (the partial directory, or the final one once renamed).
    dir: Mutex<PathBuf>,
    final_dir: PathBuf,
    /// Chunks `0..avail` are on disk and verified.
    avail: watch::Sender<u64>,
    hasher: Mutex<Option<StreamHasher>>,
    /// SHA-256 of every chunk verified here, so forwarding does not hash the data again.
    shas: Mutex<Vec<String>>,
    /// Set when the image can never complete here (corrupt data, disk error): forwarders stop.
    broken: watch::Sender<Option<String>>,
    /// For a partial image: `<partial>.lock`, held (flock) while this process owns the
    /// directory, so [`sweep_stale_partials`] can tell a live transfer from a dead one.
    owner: Option<(File, PathBuf)>,
}

/// Result of taking one chunk.
pub(crate) enum Took {
    /// Written (after the last one, the image is in the cache).
    Stored,
    /// Already had it (a resend after a re-parenting): ignored.
    Duplicate,
}

impl Store {
    /// An image that is already whole (the front-end's source, or a cache hit).
    pub fn complete(layout: Layout, digest: String, dir: &Path) -> Result<Self, StageError> {
        let files = layout.open_all(dir, false)?;
        let count = layout.count();
        Ok(Self {
            layout,
            digest,
            files,
            dir: Mutex::new(dir.to_path_buf()),
            final_dir: dir.to_path_buf(),
            avail: watch::Sender::new(count),
            hasher: Mutex::new(None),
            shas: Mutex::new(Vec::new()),
            broken: watch::Sender::new(None),
            owner: None,
        })
    }

    /// A fresh partial image in `partial`, renamed to `final_dir` when verified.
    pub fn partial(
        layout: Layout,
        digest: String,
        partial: PathBuf,
        final_dir: PathBuf,
    ) -> Result<Self, StageError> {
        // The lock exists and is held before the directory does: a directory without a held
        // lock is always garbage.
        let lock_path = lock_path(&partial);
        let lock = File::create(&lock_path).map_err(|e| StageError::Io(lock_path.clone(), e))?;
        lock.try_lock()
            .map_err(|e| StageError::Io(lock_path.clone(), std::io::Error::other(e)))?;
        std::fs::create_dir_all(&partial).map_err(|e| StageError::Io(partial.clone(), e))?;
        let files = layout.open_all(&partial, true)?;
        let hasher = StreamHasher::new(&layout);
        Ok(Self {
            layout,
            digest,
            files,
            dir: Mutex::new(partial),
            final_dir,
            avail: watch::Sender::new(0),
            hasher: Mutex::new(Some(hasher)),
            shas: Mutex::new(Vec::new()),
            broken: watch::Sender::new(None),
            owner: Some((lock, lock_path)),
        })
    }

    pub fn avail(&self) -> u64 {
        *self.avail.borrow()
    }

    pub fn is_complete(&self) -> bool {
        self.avail() == self.layout.count() && self.broken.borrow().is_none()
    }

    pub fn watch_avail(&self) -> watch::Receiver<u64> {
        self.avail.subscribe()
    }

    pub fn watch_broken(&self) -> watch::Receiver<Option<String>> {
        self.broken.subscribe()
    }

    pub fn break_with(&self, reason: String) {
        self.broken.send_replace(Some(reason));
    }

    /// The SHA-256 of chunk `i` (whose bytes are `data`): remembered when it was verified on
    /// arrival, computed for a source or cached image.
    pub fn chunk_sha(&self, i: u64, data: &[u8]) -> String {
        let known = lock(&self.shas).get(i as usize).cloned();
        known.unwrap_or_else(|| sha256_hex(data))
    }

    pub fn read(&self, i: u64) -> Result<Vec<u8>, StageError> {
        let dir = lock(&self.dir).clone();
        self.layout.read_chunk(&self.files, i, &dir)
    }

    /// Verifies and writes chunk `index`; chunks must come in order (resends of old ones are
    /// ignored), and the last one triggers the whole-image check and the rename.
    pub fn take(&self, index: u64, sha256: &str, data: &[u8]) -> Result<Took, StageError> {
        let mut hasher = lock(&self.hasher);
        let next = self.avail();
        if index < next {
            return Ok(Took::Duplicate);
        }
        if index != next {
            return Err(StageError::Corrupt(format!(
                "chunk {index} arrived, expected chunk {next}"
            )));
        }
        let h = hasher
            .as_mut()
            .ok_or_else(|| StageError::Corrupt("image already complete".into()))?;
        let got = sha256_hex(data);
        if got != sha256 {
            return Err(StageError::Corrupt(format!(
                "chunk {index}: SHA-256 {got}, sender said {sha256}"
            )));
        }
        let dir = lock(&self.dir).clone();
        self.layout.write_chunk(&self.files, index, data, &dir)?;
        h.feed(&self.layout, data);
        lock(&self.shas).push(got);
        let last = index + 1 == self.layout.count();
        if last {
            let whole = hasher.take().expect("checked above").finish(&self.layout);
            if whole != self.digest {
                return Err(StageError::Corrupt(format!(
                    "whole image SHA-256 {whole}, expected {}",
                    self.digest
                )));
            }
            self.publish(&dir)?;
        }
        self.avail.send_replace(index + 1);
        Ok(Took::Stored)
    }

    /// Makes the verified image visible under its final name, durably. What was received was
    /// checked as it arrived; what is on disk is checked again before it takes the name (a
    /// write that did not land, a file changed under us).
    fn publish(&self, partial: &Path) -> Result<(), StageError> {
        for (f, (name, _)) in self.files.iter().zip(self.layout.files()) {
            f.sync_all()
                .map_err(|e| StageError::Io(partial.join(name), e))?;
        }
        let written = self.layout.digest_of(partial)?;
        if written != self.digest {
            return Err(StageError::Corrupt(format!(
                "{}: SHA-256 {written} after writing, expected {}",
                partial.display(),
                self.digest
            )));
        }
        let mut renamed = std::fs::rename(partial, &self.final_dir);
        if renamed.is_err()
            && self.final_dir.exists()
            && !super::cache::holds(&self.layout, &self.final_dir, &self.digest)
        {
            // Something else took the name: not this image, so it goes.
            super::cache::discard(&self.final_dir)?;
            renamed = std::fs::rename(partial, &self.final_dir);
        }
        match renamed {
            Ok(()) => {
                *lock(&self.dir) = self.final_dir.clone();
                // Nothing partial is left to guard.
                if let Some((_, lock)) = &self.owner {
                    let _ = std::fs::remove_file(lock);
                }
            }
            // Another agent on this machine published the same digest first: keep theirs.
            Err(_) if super::cache::holds(&self.layout, &self.final_dir, &self.digest) => {
                let _ = std::fs::remove_dir_all(partial);
            }
            Err(e) => return Err(StageError::Io(self.final_dir.clone(), e)),
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // A partial image must never survive looking like anything but garbage.
        if self.avail() < self.layout.count() {
            let dir = lock(&self.dir).clone();
            if dir != self.final_dir && !dir.as_os_str().is_empty() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        if let Some((_, path)) = self.owner.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn lock_path(partial: &Path) -> PathBuf {
    let mut name = partial.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    partial.with_file_name(name)
}

/// Removes the `.partial-*` directories of `cache` whose owner is gone (an agent killed with
/// SIGKILL mid-transfer cannot run its cleanup). A partial counts as live while some process
/// holds the flock on its `.lock` file; the kernel drops that lock when the owner dies.
/// Returns the directories removed.
pub(crate) fn sweep_stale_partials(cache: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(".partial-") || name.ends_with(".lock") {
            continue;
        }
        let (dir, lock) = (e.path(), lock_path(&e.path()));
        let stale = match File::open(&lock) {
            // Held by its owner: a transfer in progress.
            Ok(f) => f.try_lock().is_ok(),
            Err(_) => true,
        };
        if stale && std::fs::remove_dir_all(&dir).is_ok() {
            let _ = std::fs::remove_file(&lock);
            removed.push(dir);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_only_partials_whose_owner_is_gone() {
        // Arrange: one partial whose owner died (no lock holder), one without any lock file
        // (crashed between the two steps of an older version), one live, one published image.
        let cache = tempfile::tempdir().unwrap();
        let dead = cache.path().join(".partial-aa-1-00000000");
        std::fs::create_dir(&dead).unwrap();
        File::create(lock_path(&dead)).unwrap();
        let orphan = cache.path().join(".partial-bb-2-00000000");
        std::fs::create_dir(&orphan).unwrap();
        let live = cache.path().join(".partial-cc-3-00000000");
        let held = File::create(lock_path(&live)).unwrap();
        held.try_lock().unwrap();
        std::fs::create_dir(&live).unwrap();
        let published = cache.path().join("dd");
        std::fs::create_dir(&published).unwrap();

        // Act
        let mut removed = sweep_stale_partials(cache.path());
        removed.sort();

        // Assert
        assert_eq!(removed, vec![dead.clone(), orphan.clone()]);
        assert!(!dead.exists() && !lock_path(&dead).exists() && !orphan.exists());
        assert!(live.exists() && lock_path(&live).exists() && published.exists());
        drop(held);
        assert_eq!(sweep_stale_partials(cache.path()), vec![live]);
    }
}
