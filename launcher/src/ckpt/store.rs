//! A job's checkpoint directory (`vse launch --checkpoint-dir DIR`): complete checkpoints are
//! `DIR/ckpt-<seq>/`, each published by one rename once its manifest is written; one being
//! written is `DIR/.partial-<seq>-<pid>/` and is never taken for a checkpoint. Every node
//! writes its VMs' files straight into the partial directory, so DIR must be visible at the
//! same path on every node (shared storage; nodes sharing one machine qualify).

use super::CkptError;
use super::manifest::{FORMAT, MANIFEST, Manifest};
use std::path::{Path, PathBuf};
use vmhost::files::{hash_file, sync_dir};

/// Checkpoint manifests are small: a bigger one is not ours.
const MANIFEST_MAX: u64 = 16 << 20;

pub struct CheckpointDir {
    root: PathBuf,
}

/// A complete, verified checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl CheckpointDir {
    /// The directory at `root`, made (private to the user) if it does not exist.
    pub fn create(root: &Path) -> Result<Self, CkptError> {
        use std::os::unix::fs::DirBuilderExt;
        if !root.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root)
                .map_err(|e| CkptError::io("creating the checkpoint directory", root, e))?;
        }
        let root = std::path::absolute(root)
            .map_err(|e| CkptError::io("resolving the checkpoint directory", root, e))?;
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Complete checkpoints (a manifest under the published name), oldest first.
    pub fn complete(&self) -> Result<Vec<(u64, PathBuf)>, CkptError> {
        let rd = std::fs::read_dir(&self.root)
            .map_err(|e| CkptError::io("listing the checkpoint directory", &self.root, e))?;
        let mut found: Vec<(u64, PathBuf)> = rd
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name();
                let seq = name.to_str()?.strip_prefix("ckpt-")?.parse().ok()?;
                let dir = e.path();
                dir.join(MANIFEST).is_file().then_some((seq, dir))
            })
            .collect();
        found.sort();
        Ok(found)
    }

    /// The newest complete checkpoint, verified; `None` when there is none. A newest one that
    /// fails verification is an error, never silently replaced by an older one.
    pub fn latest(&self) -> Result<Option<Checkpoint>, CkptError> {
        match self.complete()?.pop() {
            Some((_, dir)) => load(&dir).map(Some),
            None => Ok(None),
        }
    }

    /// A new checkpoint's directory, numbered after every one here.
    pub fn begin(&self) -> Result<Partial, CkptError> {
        let seq = self.complete()?.last().map_or(1, |(s, _)| s + 1);
        let dir = self
            .root
            .join(format!(".partial-{seq}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .map_err(|e| CkptError::io("creating the checkpoint's directory", &dir, e))?;
        Ok(Partial {
            dir,
            seq,
            root: self.root.clone(),
            published: false,
        })
    }

    /// Keeps the newest `keep` complete checkpoints (at least one) and removes older ones and
    /// partial ones this process left.
    pub fn prune(&self, keep: usize) -> Result<(), CkptError> {
        let all = self.complete()?;
        let old = all.len().saturating_sub(keep.max(1));
        for (_, dir) in &all[..old] {
            remove(dir);
        }
        Ok(())
    }

    /// Removes every checkpoint: the job finished, and rerunning its command starts afresh.
    pub fn retire(&self) -> Result<(), CkptError> {
        for (_, dir) in self.complete()? {
            remove(&dir);
        }
        Ok(())
    }
}

/// The manifest goes first, so a half-removed checkpoint is no longer taken for complete.
fn remove(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(MANIFEST));
    let _ = std::fs::remove_dir_all(dir);
}

/// A checkpoint being written; dropped unpublished, it is removed.
pub struct Partial {
    dir: PathBuf,
    seq: u64,
    root: PathBuf,
    published: bool,
}

impl Partial {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Writes the manifest (last, durably) and publishes the checkpoint under its final name.
    pub fn publish(mut self, manifest: &Manifest) -> Result<PathBuf, CkptError> {
        let io = |what, p: &Path, e| CkptError::io(what, p, e);
        for f in manifest.files() {
            let p = self.dir.join(&f.file);
            let len = std::fs::metadata(&p).map_err(|e| io("checking a saved file", &p, e))?;
            if len.len() != f.bytes {
                return Err(CkptError::Corrupt {
                    dir: self.dir.clone(),
                    file: f.file.clone(),
                    why: format!("{} bytes, the node saved {}", len.len(), f.bytes),
                });
            }
        }
        let tmp = self.dir.join(".checkpoint.json.tmp");
        let body = serde_json::to_vec_pretty(manifest).map_err(CkptError::Encode)?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(|e| io("writing", &tmp, e))?;
            f.write_all(&body).map_err(|e| io("writing", &tmp, e))?;
            f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
        }
        let m = self.dir.join(MANIFEST);
        std::fs::rename(&tmp, &m).map_err(|e| io("writing", &m, e))?;
        sync_dir(&self.dir).map_err(|e| io("syncing", &self.dir, e))?;
        let done = self.root.join(format!("ckpt-{}", self.seq));
        std::fs::rename(&self.dir, &done).map_err(|e| io("publishing", &done, e))?;
        sync_dir(&self.root).map_err(|e| io("syncing", &self.root, e))?;
        self.published = true;
        Ok(done)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Opens what `--restore` names: a checkpoint directory (its newest complete checkpoint) or
/// one checkpoint in it; every file is checked against the manifest.
pub fn open(path: &Path) -> Result<Checkpoint, CkptError> {
    if path.join(MANIFEST).exists() || is_partial(path) {
        return load(path);
    }
    if !path.is_dir() {
        return Err(CkptError::NotACheckpoint {
            path: path.to_path_buf(),
        });
    }
    CheckpointDir::create(path)?
        .latest()?
        .ok_or_else(|| CkptError::NoneComplete {
            dir: path.to_path_buf(),
        })
}

fn is_partial(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".partial-"))
}

/// Reads and verifies the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Checkpoint, CkptError> {
    let m = dir.join(MANIFEST);
    if is_partial(dir) || !m.is_file() {
        return Err(CkptError::Incomplete {
            dir: dir.to_path_buf(),
        });
    }
    let meta = std::fs::metadata(&m).map_err(|e| CkptError::io("reading", &m, e))?;
    if meta.len() > MANIFEST_MAX {
        return Err(CkptError::corrupt(
            dir,
            MANIFEST,
            "larger than any manifest",
        ));
    }
    let body = std::fs::read(&m).map_err(|e| CkptError::io("reading", &m, e))?;
    let manifest: Manifest = serde_json::from_slice(&body)
        .map_err(|e| CkptError::corrupt(dir, MANIFEST, &e.to_string()))?;
    if manifest.format != FORMAT {
        return Err(CkptError::Format {
            dir: dir.to_path_buf(),
            found: manifest.format,
        });
    }
    for f in manifest.files() {
        verify_file(dir, &f.file, f.bytes, &f.sha256)?;
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        manifest,
    })
}

/// A file of the checkpoint: a plain name inside `dir`, a regular file, the right contents.
fn verify_file(dir: &Path, name: &str, bytes: u64, sha256: &str) -> Result<(), CkptError> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !plain {
        return Err(CkptError::corrupt(dir, name, "not a plain file name"));
    }
    let p = dir.join(name);
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Err(CkptError::corrupt(dir, name, "not a regular file")),
        Err(_) => return Err(CkptError::corrupt(dir, name, "missing")),
    }
    let (n, sum) = hash_file(&p).map_err(|e| CkptError::io("reading", &p, e))?;
    if n != bytes {
        let why = format!("{n} bytes, the manifest says {bytes} (cut short?)");
        return Err(CkptError::corrupt(dir, name, &why));
    }
    if sum != sha256 {
        return Err(CkptError::corrupt(
            dir,
            name,
            "its SHA256 does not match the manifest",
        ));
    }
    Ok(())
}
