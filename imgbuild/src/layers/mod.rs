//! Layers: the configured root file system of a package set (every package unpacked, the
//! image's own `dpkg --configure -a` run), kept between builds so that a build whose packages
//! did not change starts from it, and one whose packages changed a little starts from the
//! closest one when that provably gives the same bytes (see [`delta`]).
//!
//! A layer is `<store>/<key>/tree` (the root, exactly as a clean build leaves it before the
//! spec's customisation) and `<store>/<key>/layer.json` (what every package put where). The
//! key is a digest of the builder version, the epoch and every package's name, version and
//! SHA256, in order. Layers are written to a temporary directory and renamed into place; a
//! layer without its `layer.json` is not a layer. The store keeps the newest [`KEEP`].

pub mod base;
pub mod delta;

use crate::deb::{Meta, Records};
use crate::plan::BuildPlan;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Layers kept; each is a whole root file system.
pub const KEEP: usize = 2;
const FORMAT: u32 = 1;

/// One package of a layer, as the delta rules need it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerPackage {
    pub name: String,
    pub version: String,
    pub sha256: String,
    /// dpkg's info file stem (`libc6:amd64` for `Multi-Arch: same`).
    pub stem: String,
    /// Non-directories it put in the tree (where they landed: `/usr/bin/su` for `/bin/su`).
    pub files: Vec<String>,
    /// Directories it lists, with the metadata it gives them.
    pub dirs: std::collections::BTreeMap<String, Meta>,
    /// Why adding or removing it alone cannot be proven to give a clean build's bytes
    /// (`None`: it can).
    pub not_inert: Option<String>,
}

/// `layer.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LayerMeta {
    pub format: u32,
    pub builder: String,
    pub epoch: u64,
    /// In the plan's order.
    pub packages: Vec<LayerPackage>,
    pub records: Records,
}

/// The layer key of a plan.
pub fn layer_key(plan: &BuildPlan, builder: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!(
        "vse layer {FORMAT}\n{builder}\nepoch {}\n",
        plan.epoch
    ));
    for p in &plan.packages {
        h.update(format!("{} {} {}\n", p.name, p.version, p.sha256));
    }
    hex::encode(&h.finalize()[..16])
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Unsafe(#[from] vse_base::Unsafe),
    #[error("copying {from} to {to} failed: {stderr}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        stderr: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |source| LayerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a tree is copied out of (or into) the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// Every file copied.
    Full,
    /// Files hard-linked, except under [`WRITABLE`] (copied): for trees whose later steps
    /// never write a file in place outside those (no post-install commands; spec files are
    /// written as new files). A whole copy of a root costs seconds, the links a fraction.
    Linked,
}

/// Top-level directories the builder's own later steps may rewrite in place (dpkg's
/// database and logs, the spec's users and groups): always real copies.
const WRITABLE: &[&str] = &["etc", "var", "root", "home", "tmp", "run", "srv", "opt"];

fn cp(args: &[&str], from: &Path, to: &Path) -> Result<(), LayerError> {
    let out = Command::new("cp")
        .args(args)
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .map_err(io(to))?;
    if !out.status.success() {
        return Err(LayerError::Copy {
            from: from.into(),
            to: to.into(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

/// Copies the tree `from` into the (new or empty) directory `to` with everything the image
/// writers read: content, modes, owners, symlinks, hard links within the tree, extended
/// attributes (a `setcap` in a maintainer script). `cp -a` does exactly that; with
/// [`CopyMode::Linked`] files are hard links (`mke2fs -d` keeps only links within its tree,
/// so the image is the same).
pub fn copy_tree(from: &Path, to: &Path, mode: CopyMode) -> Result<(), LayerError> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    match mode {
        CopyMode::Full => cp(&["-a", "--reflink=auto"], from, to),
        CopyMode::Linked => {
            cp(&["-al"], from, to)?;
            for w in WRITABLE {
                let (src, dst) = (from.join(w), to.join(w));
                let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
                if is_dir(&src) && is_dir(&dst) {
                    std::fs::remove_dir_all(&dst).map_err(io(&dst))?;
                    std::fs::create_dir(&dst).map_err(io(&dst))?;
                    cp(&["-a", "--reflink=auto"], &src, &dst)?;
                }
            }
            Ok(())
        }
    }
}

/// Removes the directory `dir` in a process of its own (reaped if this one lives that long):
/// deleting a whole root file system takes longer than most of a rebuild. Callers first move
/// it where nothing takes it for a build or a layer.
pub(crate) fn remove_in_background(dir: PathBuf) {
    let spawned = Command::new("rm")
        .arg("-rf")
        .arg("--one-file-system")
        .arg("--")
        .arg(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => drop(std::thread::spawn(move || child.wait())),
        Err(_) => drop(std::fs::remove_dir_all(&dir)),
    }
}

/// The layers of one cache directory.
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

/// A layer found in the store, held (see [`hold`]) for as long as this value lives: no
/// other build prunes or replaces it while this one copies from it.
#[derive(Debug, Clone)]
pub struct Layer {
    pub key: String,
    pub tree: PathBuf,
    pub meta: LayerMeta,
    _held: std::sync::Arc<std::fs::File>,
}

/// A flock on the layer directory `dir`: shared (waiting) for a build that reads it,
/// exclusive (not waiting) for one that removes it. `None`: not a directory, busy, or no
/// longer the directory at that path (pruned or replaced between the open and the lock).
fn hold(dir: &Path, exclusive: bool) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::File::open(dir).ok()?;
    if exclusive {
        f.try_lock().ok()?;
    } else {
        f.lock_shared().ok()?;
    }
    let (held, now) = (f.metadata().ok()?, std::fs::symlink_metadata(dir).ok()?);
    (held.is_dir() && held.dev() == now.dev() && held.ino() == now.ino()).then_some(f)
}

impl LayerStore {
    /// `layers/` under the cache root ([`vse_base::cache_root`]: `$VSE_CACHE` or its default).
    pub fn default_dir() -> PathBuf {
        crate::fetch::DebCache::default_root().join("layers")
    }

    /// Opens the store: made or checked private to this user (a root build copies its trees
    /// as they are; see [`vse_base`]).
    pub fn open(dir: &Path) -> Result<LayerStore, LayerError> {
        vse_base::private_dir(dir, "layer store (VSE_CACHE)")?;
        Ok(LayerStore {
            dir: dir.to_path_buf(),
        })
    }

    fn read(&self, key: &str) -> Option<Layer> {
        let d = self.dir.join(key);
        let held = hold(&d, false)?;
        let text = std::fs::read_to_string(d.join("layer.json")).ok()?;
        let meta: LayerMeta = serde_json::from_str(&text).ok()?;
        (meta.format == FORMAT && d.join("tree").is_dir()).then(|| Layer {
            key: key.to_string(),
            tree: d.join("tree"),
            meta,
            _held: std::sync::Arc::new(held),
        })
    }

    /// The layer for `key`, if whole.
    pub fn get(&self, key: &str) -> Option<Layer> {
        self.read(key)
    }

    /// Every whole layer of this builder and epoch (candidates to start a delta from).
    pub fn all(&self, builder: &str, epoch: u64) -> Vec<Layer> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (!name.starts_with('.')).then(|| self.read(&name)).flatten()
            })
            .filter(|l| l.meta.builder == builder && l.meta.epoch == epoch)
            .collect()
    }

    /// Saves `tree` as the layer `key` (a copy: the caller goes on changing its tree, within
    /// what `mode` allows).
    pub fn save(
        &self,
        key: &str,
        tree: &Path,
        meta: &LayerMeta,
        mode: CopyMode,
    ) -> Result<(), LayerError> {
        // Another build of the same packages saved it first: the same bytes by the key.
        if self.read(key).is_some() {
            return Ok(());
        }
        let tmp = self.dir.join(format!(".new-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let result = (|| {
            copy_tree(tree, &tmp.join("tree"), mode)?;
            let json = serde_json::to_vec(meta).map_err(|e| LayerError::Io {
                path: tmp.clone(),
                source: e.into(),
            })?;
            std::fs::write(tmp.join("layer.json"), json).map_err(io(&tmp))?;
            let dest = self.dir.join(key);
            // What is there is no layer (a read found none): moved aside unless a build holds
            // it. A rename onto a whole layer that another build saved meanwhile fails, and
            // that one is kept.
            if let Some(_gone) = hold(&dest, true) {
                self.retire(&dest);
            }
            match std::fs::rename(&tmp, &dest) {
                Ok(()) => Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {
                    let _ = std::fs::remove_dir_all(&tmp);
                    Ok(())
                }
                Err(e) => Err(io(&dest)(e)),
            }
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result?;
        self.prune(key);
        Ok(())
    }

    /// Keeps the [`KEEP`] newest layers (`keep` among them) and drops leftovers of writers
    /// that died.
    fn prune(&self, keep: &str) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut layers = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let mtime = e.metadata().and_then(|m| m.modified()).ok();
            // `.new-`: a writer that died; `.old-`: a removal cut short.
            if name.starts_with(".new-") || name.starts_with(".old-") {
                let stale = mtime
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|a| a.as_secs() > 3600);
                if stale {
                    remove_in_background(e.path());
                }
            } else if name != keep {
                layers.push((mtime, e.path()));
            }
        }
        layers.sort_by_key(|l| std::cmp::Reverse(l.0));
        for (_, p) in layers.into_iter().skip(KEEP - 1) {
            // A layer another build is copying from stays until a later prune.
            if let Some(_gone) = hold(&p, true) {
                self.retire(&p);
            }
        }
    }

    /// Renames `p` first (a dot name is never a layer), so no build takes a half-deleted
    /// one, then deletes it without making this build wait. The caller holds it exclusively.
    fn retire(&self, p: &Path) {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let gone = self.dir.join(format!(".old-{name}-{}", std::process::id()));
        if std::fs::rename(p, &gone).is_ok() {
            remove_in_background(gone);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> LayerMeta {
        LayerMeta {
            format: FORMAT,
            builder: "test".into(),
            epoch: 1,
            packages: Vec::new(),
            records: Records::default(),
        }
    }

    fn tree(dir: &Path, file: &str) -> PathBuf {
        let t = dir.join(format!("src-{file}"));
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join(file), file).unwrap();
        t
    }

    #[test]
    fn a_layer_a_build_reads_is_neither_pruned_nor_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LayerStore::open(&tmp.path().join("layers")).unwrap();
        store
            .save("a", &tree(tmp.path(), "a"), &meta(), CopyMode::Full)
            .unwrap();
        let held = store.get("a").expect("layer a");
        // Another build of the same packages: the held layer stays as it is.
        store
            .save("a", &tree(tmp.path(), "other"), &meta(), CopyMode::Full)
            .unwrap();
        assert!(held.tree.join("a").is_file());
        // Builds of other package sets prune all but the newest KEEP layers, never a held one.
        for k in ["b", "c", "d"] {
            std::thread::sleep(std::time::Duration::from_millis(20));
            store
                .save(k, &tree(tmp.path(), k), &meta(), CopyMode::Full)
                .unwrap();
        }
        assert!(held.tree.join("a").is_file(), "a held layer was pruned");
        assert!(store.get("b").is_none() && store.get("d").is_some());
        drop(held);
        store
            .save("e", &tree(tmp.path(), "e"), &meta(), CopyMode::Full)
            .unwrap();
        assert!(store.get("a").is_none(), "a released layer is pruned");
    }
}
