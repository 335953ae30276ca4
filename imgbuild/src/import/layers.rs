//! Applying one image layer (a tar changeset) to the rootfs, with the OCI rules on top of
//! `.deb` extraction (whose path confinement and metadata records are reused as they are):
//! `.wh.NAME` deletes NAME from the layers below, `.wh..wh..opq` empties a directory of what
//! the layers below put there, and an entry replaces whatever was at its path (a directory by
//! a file, a symlink by a directory). Two tricks that confinement alone would quietly redirect
//! are refused: writing through a symlink the same layer made, and a symlink that climbs above
//! the root.

use crate::deb::path::{PathError, RelPath, resolve_dir_traced};
use crate::deb::{ExtractError, Kind, Records, extract_entry};
use std::collections::HashSet;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(transparent)]
    Extract(#[from] ExtractError),
    #[error("{member}: {source}")]
    Path { member: String, source: PathError },
    #[error(
        "{member}: written through the symlink {link} that the same layer created; refusing (a layer made from a file system never does this: it is a path-escape trick)"
    )]
    ThroughOwnSymlink { member: String, link: String },
    #[error(
        "{member}: the symlinks on its path ({links}) climb above the image root; refusing instead of redirecting it"
    )]
    ClimbsAboveRoot { member: String, links: String },
    #[error("{member}: not a valid whiteout (names nothing to delete)")]
    BadWhiteout { member: String },
    #[error("reading the layer: {0}")]
    Read(io::Error),
    #[error("removing {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
}

/// What a layer held, for the importer.
#[derive(Debug, Clone, Default)]
pub struct LayerStats {
    pub entries: u64,
    /// Newest modification time of any entry (the epoch of a plain rootfs tarball).
    pub max_mtime: u64,
}

/// Paths this layer put in place (by where they landed), their ancestors, and its symlinks.
#[derive(Default)]
struct Written {
    paths: HashSet<String>,
    ancestors: HashSet<String>,
    symlinks: HashSet<String>,
}

impl Written {
    fn mark(&mut self, key: &str) {
        self.paths.insert(key.to_string());
        let mut k = key;
        while let Some((parent, _)) = k.rsplit_once('/') {
            k = if parent.is_empty() { "/" } else { parent };
            if !self.ancestors.insert(k.to_string()) || k == "/" {
                break;
            }
        }
    }

    fn keeps(&self, key: &str) -> bool {
        self.paths.contains(key) || self.ancestors.contains(key)
    }
}

fn child_key(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

fn key_of(root: &Path, host: &Path) -> String {
    match host.strip_prefix(root) {
        Ok(r) if r.as_os_str().is_empty() => "/".into(),
        Ok(r) => format!("/{}", r.to_string_lossy()),
        Err(_) => host.to_string_lossy().into_owned(),
    }
}

/// Applies the layer tar `tar` on top of `root`.
pub fn apply_layer(
    tar: &mut dyn Read,
    root: &Path,
    records: &mut Records,
) -> Result<LayerStats, LayerError> {
    let mut stats = LayerStats::default();
    let mut layer = Written::default();
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(LayerError::Read)? {
        let mut entry = entry.map_err(LayerError::Read)?;
        let ty = entry.header().entry_type();
        if matches!(ty, tar::EntryType::XGlobalHeader) {
            continue;
        }
        stats.entries += 1;
        let mtime = entry.header().mtime().unwrap_or(0);
        stats.max_mtime = stats.max_mtime.max(mtime);
        let raw = entry.path_bytes().into_owned();
        let member = String::from_utf8_lossy(&raw).into_owned();
        let perr = |source| LayerError::Path {
            member: member.clone(),
            source,
        };
        let rel = RelPath::parse(&raw).map_err(perr)?;
        let Some((parent, name)) = rel.split_last() else {
            extract_entry(&mut entry, root, records)?;
            continue;
        };
        let whiteout = name.starts_with(WHITEOUT);
        let dir = match resolve_dir_traced(root, &parent, !whiteout) {
            Ok(d) => d,
            // Deleting below a path that does not exist (or is a file): nothing to delete.
            Err(PathError::NotADirectory { .. }) if whiteout => continue,
            Err(PathError::Io { source, .. })
                if whiteout && source.kind() == io::ErrorKind::NotFound =>
            {
                continue;
            }
            Err(e) => return Err(perr(e)),
        };
        if let Some(link) = dir.symlinks.iter().find(|l| layer.symlinks.contains(*l)) {
            return Err(LayerError::ThroughOwnSymlink {
                member,
                link: link.clone(),
            });
        }
        if dir.clamped {
            return Err(LayerError::ClimbsAboveRoot {
                member,
                links: dir.symlinks.join(" → "),
            });
        }
        let dir_key = key_of(root, &dir.host);
        if whiteout {
            apply_whiteout(root, records, &layer, &dir.host, &dir_key, name, &member)?;
            continue;
        }
        let host = dir.host.join(name);
        let key = child_key(&dir_key, name);
        if let Ok(md) = std::fs::symlink_metadata(&host) {
            // An entry replaces what the layers below had there (overlayfs semantics), except
            // that a directory over a directory merges.
            let is_dir_entry = ty == tar::EntryType::Directory;
            if md.is_dir() != is_dir_entry {
                remove_path(records, &host, &key)?;
            }
        }
        let e = extract_entry(&mut entry, root, records)?;
        layer.mark(&e.landed);
        if e.kind == Kind::Symlink {
            layer.symlinks.insert(e.landed);
        }
    }
    Ok(stats)
}

fn apply_whiteout(
    root: &Path,
    records: &mut Records,
    layer: &Written,
    dir: &Path,
    dir_key: &str,
    name: &str,
    member: &str,
) -> Result<(), LayerError> {
    if name == OPAQUE {
        return prune(root, records, layer, dir, dir_key);
    }
    if name.starts_with(".wh..wh.") {
        return Ok(()); // aufs bookkeeping (`.wh..wh.plnk`), not a deletion
    }
    let target = name.strip_prefix(WHITEOUT).unwrap_or_default();
    if target.is_empty() || target == "." || target == ".." {
        return Err(LayerError::BadWhiteout {
            member: member.into(),
        });
    }
    let host = dir.join(target);
    let key = child_key(dir_key, target);
    // A whiteout hides the layers below only: what this layer wrote stays.
    if layer.paths.contains(&key) {
        return Ok(());
    }
    if layer.ancestors.contains(&key) {
        return prune(root, records, layer, &host, &key);
    }
    remove_path(records, &host, &key)
}

/// Removes from directory `dir` everything the layers below put there, keeping what this layer
/// wrote (an opaque directory).
fn prune(
    root: &Path,
    records: &mut Records,
    layer: &Written,
    dir: &Path,
    key: &str,
) -> Result<(), LayerError> {
    let rm_err = |source| LayerError::Remove {
        path: dir.to_path_buf(),
        source,
    };
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(rm_err(e)),
    };
    let mut names: Vec<_> = rd
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(rm_err)?;
    names.sort();
    for n in names {
        let host = dir.join(&n);
        let ck = child_key(key, &n.to_string_lossy());
        if !layer.keeps(&ck) {
            remove_path(records, &host, &ck)?;
        } else if std::fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir()) {
            prune(root, records, layer, &host, &ck)?;
        }
    }
    // Device nodes and FIFOs live only in the records.
    let prefix = child_key(key, "");
    let stale: Vec<String> = records
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .filter(|(k, _)| !layer.keeps(k) && std::fs::symlink_metadata(root.join(&k[1..])).is_err())
        .map(|(k, _)| k.clone())
        .collect();
    for k in stale {
        records.remove(&k);
    }
    Ok(())
}

/// Deletes `host` (a whole tree for a directory; never following a symlink) and its records.
fn remove_path(records: &mut Records, host: &Path, key: &str) -> Result<(), LayerError> {
    let r = match std::fs::symlink_metadata(host) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(host),
        Ok(_) => std::fs::remove_file(host),
        Err(_) => Ok(()),
    };
    r.map_err(|source| LayerError::Remove {
        path: host.to_path_buf(),
        source,
    })?;
    records.remove(key);
    let prefix = child_key(key, "");
    let below: Vec<String> = records
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for k in below {
        records.remove(&k);
    }
    Ok(())
}
