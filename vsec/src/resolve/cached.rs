//! Loading repositories through the index cache.
//!
//! Every run verifies the Release files (signature, Valid-Until) exactly as before; they
//! list the SHA256 and size of every index. A cache file is named by a digest of those lines
//! (with the architecture, the repository order and the cache format), so it is used only
//! for indices that are provably the ones the verified Release files describe: a Release
//! re-signed with the same indices reuses it, any changed index makes a new one. A missing,
//! damaged, truncated or foreign file is rebuilt from the verified indices, never trusted.
//! When the cache directory cannot be used the indices are parsed as without a cache and
//! the note says why.

use super::request::{RepoConfig, ResolveError};
use crate::index::PackagesIndex;
use crate::lock::LockedRepository;
use crate::repo::{Cache, Fetcher, LoadOptions, VerifiedRelease, load_indices, open_release};
use crate::solve::cached::{self, CacheFileError};
use crate::solve::{CachedUniverse, Catalog, Universe};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What the index cache did for one load.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum IndexCacheNote {
    /// The file matched the verified Release files and was mapped.
    Reused { path: PathBuf },
    /// No file yet for these indices: parsed and written.
    Built { path: PathBuf },
    /// A file was there but not usable (why); parsed and written again.
    Rebuilt { path: PathBuf, reason: String },
    /// Parsed without the cache (why).
    Off { reason: String },
    /// No usable file for these indices (`reason`: why an existing one was not used): parsed,
    /// and the file is being written by a process of its own, which this run did not wait for.
    Building {
        path: PathBuf,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl std::fmt::Display for IndexCacheNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexCacheNote::Reused { path } => write!(f, "reused {}", path.display()),
            IndexCacheNote::Built { path } => write!(f, "built {}", path.display()),
            IndexCacheNote::Rebuilt { path, reason } => {
                write!(f, "rebuilt {} ({reason})", path.display())
            }
            IndexCacheNote::Off { reason } => write!(f, "not used: {reason}"),
            IndexCacheNote::Building { path, reason } => {
                write!(f, "writing {} in the background", path.display())?;
                match reason {
                    Some(r) => write!(f, " ({r})"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl IndexCacheNote {
    /// The cache file this note is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            IndexCacheNote::Reused { path }
            | IndexCacheNote::Built { path }
            | IndexCacheNote::Building { path, .. }
            | IndexCacheNote::Rebuilt { path, .. } => Some(path),
            IndexCacheNote::Off { .. } => None,
        }
    }
}

/// `index/` under the cache root ([`vse_base::cache_root`]: `$VSE_CACHE`, else root's
/// `/var/cache/vse`, a user's `$XDG_CACHE_HOME/vse` or `~/.cache/vse`).
pub fn default_index_cache_dir() -> PathBuf {
    vse_base::cache_root().join("index")
}

/// Cache files kept in the directory (the newest; older ones are removed when one is written).
const KEEP: usize = 4;

/// The digest that names a cache file.
fn cache_key(cfg: &RepoConfig, verified: &[VerifiedRelease]) -> Result<[u8; 32], ResolveError> {
    let mut h = Sha256::new();
    h.update(format!(
        "vse index cache {} {}\narch {}\n",
        cached::FORMAT,
        env!("CARGO_PKG_VERSION"),
        cfg.arch
    ));
    for (i, v) in verified.iter().enumerate() {
        h.update(format!("repository {i}\n"));
        for (path, e) in v.index_digests(&cfg.arch)? {
            h.update(format!("{path} {} {}\n", e.sha256, e.size));
        }
    }
    Ok(h.finalize().into())
}

/// A cache file is trusted by its name once its key matches: only a directory nobody else
/// can write may hold one (see [`vse_base`]).
fn prepare_dir(dir: &Path) -> Result<(), vse_base::Unsafe> {
    vse_base::private_dir(dir, "index cache (VSE_CACHE)")
}

/// Verified repositories and their candidates, and what the index cache did.
pub struct CachedLoad {
    pub universe: Box<dyn Catalog>,
    pub repositories: Vec<LockedRepository>,
    pub note: IndexCacheNote,
    /// The cache file still to write, when writes are deferred ([`defer_writes`]).
    pub pending: Option<PendingCache>,
}

/// Whether a load that parsed leaves the cache file to its caller instead of writing it
/// before it returns.
static DEFER: AtomicBool = AtomicBool::new(false);

/// From now on, this process's loads leave the cache file to write to their callers
/// ([`PendingCache`]): `vse lock` writes it once the lock is out, without making the user
/// wait for it.
pub fn defer_writes() {
    DEFER.store(true, Ordering::Relaxed);
}

/// A cache file that a load which parsed the indices did not write yet.
#[derive(Debug)]
pub struct PendingCache {
    path: PathBuf,
    dir: PathBuf,
    key: [u8; 32],
    arch: String,
    /// Why an existing file was not used (`None`: there was none).
    rebuilt: Option<String>,
}

impl PendingCache {
    /// The note of a file left to a background writer.
    pub fn building(&self) -> IndexCacheNote {
        IndexCacheNote::Building {
            path: self.path.clone(),
            reason: self.rebuilt.clone(),
        }
    }

    /// Writes the file for `u` (the universe parsed by the load) now.
    pub fn write(&self, u: &Universe) -> IndexCacheNote {
        match cached::write(&self.path, &self.key, u, &self.arch) {
            Err(e) => IndexCacheNote::Off {
                reason: format!("cannot write {}: {e}", self.path.display()),
            },
            Ok(()) => {
                prune(&self.dir, &self.path);
                match &self.rebuilt {
                    None => IndexCacheNote::Built {
                        path: self.path.clone(),
                    },
                    Some(reason) => IndexCacheNote::Rebuilt {
                        path: self.path.clone(),
                        reason: reason.clone(),
                    },
                }
            }
        }
    }
}

/// Loads and verifies every repository like [`super::load_universe`], through the index
/// cache at `cfg.index_cache` (none: no cache). `rebuild` ignores an existing file (its
/// reason is recorded), for when a file turned out damaged after it was opened.
pub fn load_universe_cached(
    cfg: &RepoConfig,
    rebuild: Option<&str>,
) -> Result<CachedLoad, ResolveError> {
    if cfg.sources.is_empty() {
        return Err(ResolveError::NoSources);
    }
    let opts = LoadOptions {
        arch: cfg.arch.clone(),
        default_keyrings: cfg.keyrings.clone(),
        validity: cfg.validity,
        cache: cfg.cache_dir.as_deref().map(Cache::new),
        snapshot: cfg.snapshot.clone(),
    };
    let mut fetcher = Fetcher::new(cfg.retry.clone());
    let mut verified = Vec::with_capacity(cfg.sources.len());
    for src in &cfg.sources {
        let mut src = src.clone();
        src.rewrite(&cfg.mirror_rewrites);
        verified.push(open_release(&src, &cfg.location, &opts, &mut fetcher)?);
    }
    let repos: Vec<LockedRepository> = verified.iter().map(|v| v.locked.clone()).collect();
    let key = cache_key(cfg, &verified)?;
    let parse = |fetcher: &mut Fetcher| -> Result<Universe, ResolveError> {
        let mut index = PackagesIndex::default();
        for (i, v) in verified.iter().enumerate() {
            index.extend(load_indices(v, &cfg.location, &opts, fetcher, i)?);
        }
        Ok(Universe::new(index, &cfg.arch))
    };
    let Some(dir) = &cfg.index_cache else {
        let note = IndexCacheNote::Off {
            reason: "disabled".into(),
        };
        return Ok(CachedLoad {
            universe: Box::new(parse(&mut fetcher)?),
            repositories: repos,
            note,
            pending: None,
        });
    };
    if let Err(e) = prepare_dir(dir) {
        let note = IndexCacheNote::Off {
            reason: format!("cannot use the {e}"),
        };
        return Ok(CachedLoad {
            universe: Box::new(parse(&mut fetcher)?),
            repositories: repos,
            note,
            pending: None,
        });
    }
    let path = dir.join(format!("{}.vsei", hex::encode(&key[..16])));
    let arch = cfg.arch.as_str();
    let why_rebuild = match rebuild {
        Some(why) => Some(why.to_string()),
        None => match CachedUniverse::open(&path, &key, arch) {
            Ok(u) => {
                return Ok(CachedLoad {
                    universe: Box::new(u),
                    repositories: repos,
                    note: IndexCacheNote::Reused { path },
                    pending: None,
                });
            }
            Err(CacheFileError::Missing) => None,
            Err(e) => Some(e.to_string()),
        },
    };
    let u = parse(&mut fetcher)?;
    let pending = PendingCache {
        path,
        dir: dir.clone(),
        key,
        arch: arch.to_string(),
        rebuilt: why_rebuild,
    };
    if DEFER.load(Ordering::Relaxed) {
        let note = pending.building();
        return Ok(CachedLoad {
            universe: Box::new(u),
            repositories: repos,
            note,
            pending: Some(pending),
        });
    }
    Ok(CachedLoad {
        note: pending.write(&u),
        universe: Box::new(u),
        repositories: repos,
        pending: None,
    })
}

/// Keeps the [`KEEP`] newest cache files and removes temporary files of crashed writers.
fn prune(dir: &Path, keep: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(mtime) = e.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        let age = now.duration_since(mtime).unwrap_or_default();
        if name.starts_with(".index-") && age.as_secs() > 3600 {
            let _ = std::fs::remove_file(&p);
        } else if name.ends_with(".vsei") && p != keep {
            files.push((mtime, p));
        }
    }
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    for (_, p) in files.into_iter().skip(KEEP - 1) {
        let _ = std::fs::remove_file(p);
    }
}

/// Removes a cache file found damaged after it was opened.
pub fn discard(note: &IndexCacheNote) {
    if let Some(p) = note.path() {
        let _ = std::fs::remove_file(p);
    }
}
