//! One image on one node while it is staged: the open files, how many chunks are verified
//! (senders wait on that to forward while this node still receives and writes), the wire form
//! of recent chunks (relayed as received, not re-encoded), and the chunk table from the offer.

use super::{
    StageError,
    chunk::{self, Encoded, Encoding},
    layout::{ChunkHash, Layout},
};
use crate::sync::lock;
use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};
use tokio::sync::watch;

/// Wire forms kept for forwarding: enough for every child's window, bounded in memory.
const RECENT: usize = 64;

type Slot = Arc<Mutex<Option<Arc<Encoded>>>>;

pub(crate) struct Store {
    pub layout: Layout,
    pub digest: String,
    /// Every chunk's hash (`None`: a hole), from the source's single pass over the image.
    pub table: Vec<ChunkHash>,
    files: Vec<File>,
    /// Where the files are now (the partial directory, or the final one once renamed).
    dir: Mutex<PathBuf>,
    final_dir: PathBuf,
    /// Chunks `0..avail` are on disk and verified (what a receiver acknowledges).
    avail: watch::Sender<u64>,
    /// Chunks `0..verified` are verified and in `recent` or on disk: they may be forwarded,
    /// possibly before this node has written them (cut-through).
    verified: watch::Sender<u64>,
    /// Serialises receiving: chunks are taken in order.
    taking: Mutex<()>,
    recent: Mutex<BTreeMap<u64, Slot>>,
    /// zstd level for chunks this node encodes from disk (a source, a cache hit).
    level: Option<i32>,
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
    pub fn complete(
        layout: Layout,
        digest: String,
        table: Vec<ChunkHash>,
        dir: &Path,
        level: Option<i32>,
    ) -> Result<Self, StageError> {
        let files = layout.open_all(dir, false)?;
        let count = layout.count();
        Ok(Self {
            layout,
            digest,
            table,
            files,
            dir: Mutex::new(dir.to_path_buf()),
            final_dir: dir.to_path_buf(),
            avail: watch::Sender::new(count),
            verified: watch::Sender::new(count),
            taking: Mutex::new(()),
            recent: Mutex::new(BTreeMap::new()),
            level,
            broken: watch::Sender::new(None),
            owner: None,
        })
    }

    /// A fresh partial image in `partial`, renamed to `final_dir` when verified.
    pub fn partial(
        layout: Layout,
        digest: String,
        table: Vec<ChunkHash>,
        partial: PathBuf,
        final_dir: PathBuf,
        level: Option<i32>,
    ) -> Result<Self, StageError> {
        // The lock exists and is held before the directory does: a directory without a held
        // lock is always garbage.
        let lock_path = lock_path(&partial);
        let lock = File::create(&lock_path).map_err(|e| StageError::Io(lock_path.clone(), e))?;
        lock.try_lock()
            .map_err(|e| StageError::Io(lock_path.clone(), std::io::Error::other(e)))?;
        std::fs::create_dir_all(&partial).map_err(|e| StageError::Io(partial.clone(), e))?;
        let files = layout.open_all(&partial, true)?;
        let store = Self {
            layout,
            digest,
            table,
            files,
            dir: Mutex::new(partial.clone()),
            final_dir,
            avail: watch::Sender::new(0),
            verified: watch::Sender::new(0),
            taking: Mutex::new(()),
            recent: Mutex::new(BTreeMap::new()),
            level,
            broken: watch::Sender::new(None),
            owner: Some((lock, lock_path)),
        };
        let first = store.next_data(0);
        if first == store.layout.count() {
            // Nothing but holes: the empty files are the image.
            store.publish(&partial)?;
        }
        store.verified.send_replace(first);
        store.avail.send_replace(first);
        Ok(store)
    }

    /// The first data chunk at or after `i` (the chunk count when there is none).
    pub fn next_data(&self, i: u64) -> u64 {
        let count = self.layout.count();
        (i..count)
            .find(|j| self.table[*j as usize].is_some())
            .unwrap_or(count)
    }

    /// Bytes of the image that are not holes.
    pub fn data_bytes(&self) -> u64 {
        (0..self.layout.count())
            .filter(|i| self.table[*i as usize].is_some())
            .map(|i| self.layout.chunk_len(i) as u64)
            .sum()
    }

    pub fn avail(&self) -> u64 {
        *self.avail.borrow()
    }

    pub fn is_complete(&self) -> bool {
        self.avail() == self.layout.count() && self.broken.borrow().is_none()
    }

    pub fn watch_verified(&self) -> watch::Receiver<u64> {
        self.verified.subscribe()
    }

    pub fn watch_broken(&self) -> watch::Receiver<Option<String>> {
        self.broken.subscribe()
    }

    pub fn break_with(&self, reason: String) {
        self.broken.send_replace(Some(reason));
    }

    fn slot(&self, i: u64) -> Slot {
        let mut recent = lock(&self.recent);
        let slot = recent.entry(i).or_default().clone();
        // Forget the oldest wire forms, but never one not yet on disk (it could not be read
        // back for a slow child).
        let avail = self.avail();
        while recent.len() > RECENT {
            match recent.keys().next().copied() {
                Some(k) if k < avail && k != i => recent.remove(&k),
                _ => break,
            };
        }
        slot
    }

    /// Data chunk `i` in its wire form: as received, or read and encoded once for every child
    /// that asks (blocking: disk and compression).
    pub fn wire(&self, i: u64) -> Result<Arc<Encoded>, StageError> {
        let slot = self.slot(i);
        let mut s = lock(&slot);
        if let Some(e) = &*s {
            return Ok(e.clone());
        }
        let dir = lock(&self.dir).clone();
        let data = self.layout.read_chunk(&self.files, i, &dir)?;
        let data = data.ok_or_else(|| {
            StageError::Corrupt(format!("chunk {i} is all zeros on disk, not a data chunk"))
        })?;
        let e = Arc::new(chunk::encode(data, self.level));
        *s = Some(e.clone());
        Ok(e)
    }

    /// Verifies chunk `index` against the table, makes it available to forwarders, writes it
    /// (holes left unwritten), and after the last one publishes the image. Chunks come in
    /// order, holes skipped; resends of old ones are ignored.
    pub fn take(&self, index: u64, encoding: Encoding, bytes: Vec<u8>) -> Result<Took, StageError> {
        let _turn = lock(&self.taking);
        let next = *self.verified.borrow();
        if index < next {
            return Ok(Took::Duplicate);
        }
        if index != next {
            return Err(StageError::Corrupt(format!(
                "chunk {index} arrived, expected chunk {next}"
            )));
        }
        // Once every chunk is in, `next` is the chunk count: an index there (or past it) has
        // no range in the image (its length would underflow).
        if index >= self.layout.count() {
            return Err(StageError::Corrupt(format!(
                "chunk {index} arrived, but the image has only {} chunks",
                self.layout.count()
            )));
        }
        let len = self.layout.chunk_len(index);
        let want = self.table.get(index as usize).copied().flatten();
        let data = chunk::decode(index, encoding, &bytes, len, &want)?;
        *lock(&self.slot(index)) = Some(Arc::new(Encoded { encoding, bytes }));
        let after = self.next_data(index + 1);
        self.verified.send_replace(after);
        let dir = lock(&self.dir).clone();
        self.layout.write_chunk(&self.files, index, &data, &dir)?;
        if after == self.layout.count() {
            self.publish(&dir)?;
        }
        self.avail.send_replace(after);
        Ok(Took::Stored)
    }

    /// Makes the verified image visible under its final name, durably: one fsync per file,
    /// after the last chunk. Every chunk was checked against its hash before it was written.
    fn publish(&self, partial: &Path) -> Result<(), StageError> {
        for (f, (name, size)) in self.files.iter().zip(self.layout.files()) {
            f.sync_all()
                .map_err(|e| StageError::Io(partial.join(&name), e))?;
            let len = f.metadata().map(|m| m.len());
            if len.as_ref().is_ok_and(|l| *l != size) {
                return Err(StageError::Corrupt(format!(
                    "{}: {} bytes after writing, expected {size}",
                    partial.join(&name).display(),
                    len.unwrap_or(0)
                )));
            }
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

    /// Fuzzing found it (fuzz/corpus/stage_receiver/regress-chunk-index-eq-count): a chunk
    /// whose index equals the chunk count, after the last one, made `chunk_len` underflow.
    #[test]
    fn a_chunk_past_the_last_is_refused() {
        // Arrange: a 5-byte image in chunks of 4, both chunks received and published.
        let cache = tempfile::tempdir().unwrap();
        let layout = Layout::new(vec![("a".into(), 5)], 4).unwrap();
        let sha = super::super::layout::sha256;
        let table = vec![Some(sha(b"hell")), Some(sha(b"o"))];
        let digest = layout.digest(&table);
        let store = Store::partial(
            layout,
            digest.clone(),
            table,
            cache.path().join(".partial-x"),
            cache.path().join(&digest),
            None,
        )
        .unwrap();
        assert!(matches!(
            store.take(0, Encoding::Raw, b"hell".to_vec()),
            Ok(Took::Stored)
        ));
        assert!(matches!(
            store.take(1, Encoding::Raw, b"o".to_vec()),
            Ok(Took::Stored)
        ));
        assert!(store.is_complete());

        // Act
        let past = store.take(2, Encoding::Raw, b"x".to_vec());

        // Assert
        assert!(
            matches!(past, Err(StageError::Corrupt(_))),
            "{:?}",
            past.err()
        );
    }
}
