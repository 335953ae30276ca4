//! Loading one repository (URI + suite + components): Release, signature, indices.

use super::RepoError;
use super::compress::{Compression, decompress};
use super::fetch::{Cache, FetchError, Fetcher, sha256_hex};
use super::release::{IndexEntry, Release};
use super::sources::{SignedBy, SourceEntry};
use super::verify::{Keyring, verify_detached, verify_inrelease};
use crate::deb::Arch;
use crate::index::PackagesIndex;
use crate::lock::LockedRepository;
use chrono::{DateTime, Utc};
use std::path::{Path, PathBuf};

/// Where the archive's files come from.
#[derive(Debug, Clone)]
pub enum Location {
    /// Fetch over http(s):// or file:// (the entry's URI).
    Remote,
    /// Read what apt downloaded into this directory (normally `/var/lib/apt/lists`).
    AptLists(PathBuf),
}

/// Against which time Valid-Until is checked.
#[derive(Debug, Clone, Copy)]
pub enum ValidityCheck {
    Now,
    At(DateTime<Utc>),
    /// Accept expired Release files (explicit user or policy decision).
    Ignore,
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub arch: Arch,
    /// Keyrings for entries without their own `signed-by`.
    pub default_keyrings: Vec<PathBuf>,
    pub validity: ValidityCheck,
    pub cache: Option<Cache>,
    /// `YYYYMMDDTHHMMSSZ`.
    pub snapshot: Option<String>,
}

#[derive(Debug)]
pub struct LoadedRepository {
    pub locked: LockedRepository,
    pub index: PackagesIndex,
}

/// Loads, verifies and parses one repository. `repo_idx` is stored in every package.
pub fn load_repository(
    entry: &SourceEntry,
    location: &Location,
    opts: &LoadOptions,
    fetcher: &mut Fetcher,
    repo_idx: usize,
) -> Result<LoadedRepository, RepoError> {
    let v = open_release(entry, location, opts, fetcher)?;
    let index = load_indices(&v, location, opts, fetcher, repo_idx)?;
    Ok(LoadedRepository {
        locked: v.locked,
        index,
    })
}

/// A repository whose Release file verified (signature, Valid-Until): what its indices must
/// hash to is known, nothing of them is read yet.
#[derive(Debug, Clone)]
pub struct VerifiedRelease {
    /// The entry the files come from (a snapshot pins it to the snapshot's URL).
    pub entry: SourceEntry,
    pub release: Release,
    pub locked: LockedRepository,
}

impl VerifiedRelease {
    /// Every `SHA256:` line of the indices this repository contributes for `arch` (each
    /// component's `Packages` and its compressed variants): equal lines mean equal indices.
    pub fn index_digests(&self, arch: &Arch) -> Result<Vec<(String, IndexEntry)>, RepoError> {
        let mut out = Vec::new();
        for comp in &self.entry.components {
            let rel = format!("{comp}/binary-{arch}/Packages");
            let before = out.len();
            for (path, e) in self.release.sha256.range(rel.clone()..) {
                if !path.starts_with(&rel) {
                    break;
                }
                if path.len() == rel.len() || path[rel.len()..].starts_with('.') {
                    out.push((path.clone(), e.clone()));
                }
            }
            if out.len() == before {
                return Err(RepoError::MissingIndex {
                    what: format!("{} {}", self.entry.uri, self.entry.suite),
                    path: rel,
                });
            }
        }
        Ok(out)
    }
}

/// Fetches (or reads from apt's lists) and verifies the Release file of `entry`.
pub fn open_release(
    entry: &SourceEntry,
    location: &Location,
    opts: &LoadOptions,
    fetcher: &mut Fetcher,
) -> Result<VerifiedRelease, RepoError> {
    let ring = keyring_for(entry, opts)?;
    let what = format!("{} {}", entry.uri, entry.suite);
    let (release_bytes, release_text) = match location {
        Location::Remote => remote_release(entry, fetcher, opts.cache.as_ref(), &ring)?,
        Location::AptLists(dir) => lists_release(entry, dir, &ring)?,
    };
    let release =
        Release::parse(Path::new(&format!("{what} Release")), &release_text).map_err(|source| {
            RepoError::Release {
                what: what.clone(),
                source,
            }
        })?;
    if let Some(snap) = &opts.snapshot {
        match (&release.snapshots, location) {
            (Some(tpl), Location::Remote) if !entry.uri.contains(snap.as_str()) => {
                let mut pinned = entry.clone();
                pinned.uri = tpl
                    .replace("@SNAPSHOTID@", snap)
                    .trim_end_matches('/')
                    .into();
                return open_release(&pinned, location, opts, fetcher);
            }
            (Some(_), Location::Remote) => {}
            _ => {
                return Err(RepoError::NoSnapshot {
                    what,
                    snapshot: snap.clone(),
                });
            }
        }
    }
    check_validity(&what, &release, opts)?;
    Ok(VerifiedRelease {
        locked: LockedRepository {
            url: entry.uri.clone(),
            suite: entry.suite.clone(),
            components: entry.components.clone(),
            release_date: release.date_raw.clone(),
            release_sha256: sha256_hex(&release_bytes),
        },
        entry: entry.clone(),
        release,
    })
}

/// Reads, checks against the verified Release and parses the repository's indices.
pub fn load_indices(
    v: &VerifiedRelease,
    location: &Location,
    opts: &LoadOptions,
    fetcher: &mut Fetcher,
    repo_idx: usize,
) -> Result<PackagesIndex, RepoError> {
    let entry = &v.entry;
    let mut index = PackagesIndex::default();
    for comp in &entry.components {
        let rel = format!("{comp}/binary-{}/Packages", opts.arch);
        let text = match location {
            Location::Remote => {
                remote_index(entry, &v.release, &rel, fetcher, opts.cache.as_ref())?
            }
            Location::AptLists(dir) => lists_index(entry, dir, &v.release, &rel)?,
        };
        let label = PathBuf::from(format!("{}/dists/{}/{rel}", entry.uri, entry.suite));
        let text = String::from_utf8(text).map_err(|_| RepoError::NotText {
            what: label.display().to_string(),
        })?;
        index.extend(PackagesIndex::parse(&label, &text, repo_idx)?);
    }
    Ok(index)
}

fn keyring_for(entry: &SourceEntry, opts: &LoadOptions) -> Result<Keyring, RepoError> {
    Ok(match &entry.signed_by {
        SignedBy::Default => Keyring::load(&opts.default_keyrings)?,
        SignedBy::Keyrings(k) => Keyring::load(k)?,
        SignedBy::Inline(text) => {
            let mut r = Keyring::default();
            r.add_armored(Path::new(&entry.origin), text)?;
            r
        }
    })
}

fn check_validity(what: &str, r: &Release, opts: &LoadOptions) -> Result<(), RepoError> {
    let at = match (opts.validity, &opts.snapshot) {
        (ValidityCheck::Ignore, _) => return Ok(()),
        (ValidityCheck::At(t), _) => t,
        (ValidityCheck::Now, Some(s)) => parse_snapshot(s).unwrap_or_else(Utc::now),
        (ValidityCheck::Now, None) => Utc::now(),
    };
    match (r.valid_until, &r.valid_until_raw) {
        (Some(until), Some(raw)) if until < at => Err(RepoError::Expired {
            what: what.to_string(),
            valid_until: raw.clone(),
            checked_at: at.format("%a, %d %b %Y %H:%M:%S UTC").to_string(),
        }),
        _ => Ok(()),
    }
}

/// `20250520T000000Z` → time.
pub fn parse_snapshot(s: &str) -> Option<DateTime<Utc>> {
    chrono::NaiveDateTime::parse_from_str(s, "%Y%m%dT%H%M%SZ")
        .ok()
        .map(|n| n.and_utc())
}

fn remote_release(
    entry: &SourceEntry,
    fetcher: &mut Fetcher,
    cache: Option<&Cache>,
    ring: &Keyring,
) -> Result<(Vec<u8>, String), RepoError> {
    let base = format!("{}/dists/{}", entry.uri, entry.suite);
    let url = format!("{base}/InRelease");
    let got = match fetcher.get(&url) {
        Ok(b) => {
            if let Some(c) = cache {
                // A cache that cannot be written only costs the offline rerun.
                let _ = c.put_release(&url, &b);
            }
            Some(b)
        }
        Err(FetchError::NotFound { .. }) => None,
        Err(e @ FetchError::Unreachable { .. }) => match cache.and_then(|c| c.get_release(&url)) {
            // Offline with a warm cache: the cached copy is re-verified below.
            Some(b) => Some(b),
            None => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    };
    if let Some(b) = got {
        let text = String::from_utf8_lossy(&b).into_owned();
        let signed = verify_inrelease(&url, &text, ring)?;
        return Ok((b, signed));
    }
    let rurl = format!("{base}/Release");
    let content = fetcher.get(&rurl)?;
    let sig = fetcher.get(&format!("{rurl}.gpg"))?;
    verify_detached(&rurl, &content, &sig, ring)?;
    let text = String::from_utf8_lossy(&content).into_owned();
    Ok((content, text))
}

/// apt's file naming in its lists directory: URI without scheme, `/` → `_`.
fn lists_prefix(entry: &SourceEntry) -> String {
    let no_scheme = entry
        .uri
        .split_once("://")
        .map_or(entry.uri.as_str(), |(_, r)| r);
    format!("{}_dists_{}", no_scheme.trim_end_matches('/'), entry.suite).replace('/', "_")
}

fn lists_release(
    entry: &SourceEntry,
    dir: &Path,
    ring: &Keyring,
) -> Result<(Vec<u8>, String), RepoError> {
    let prefix = dir.join(lists_prefix(entry));
    let inrel = PathBuf::from(format!("{}_InRelease", prefix.display()));
    if let Ok(b) = std::fs::read(&inrel) {
        let text = String::from_utf8_lossy(&b).into_owned();
        let signed = verify_inrelease(&inrel.display().to_string(), &text, ring)?;
        return Ok((b, signed));
    }
    let rel = PathBuf::from(format!("{}_Release", prefix.display()));
    let content = std::fs::read(&rel).map_err(|_| RepoError::NotInLists { path: inrel })?;
    let sig_path = PathBuf::from(format!("{}.gpg", rel.display()));
    let sig = std::fs::read(&sig_path).map_err(|_| RepoError::NotInLists { path: sig_path })?;
    verify_detached(&rel.display().to_string(), &content, &sig, ring)?;
    let text = String::from_utf8_lossy(&content).into_owned();
    Ok((content, text))
}

fn check_hash(what: &str, data: &[u8], sha: &str, size: u64) -> Result<(), RepoError> {
    let actual = sha256_hex(data);
    if actual != sha || data.len() as u64 != size {
        return Err(RepoError::HashMismatch {
            what: what.to_string(),
            expected: sha.to_string(),
            expected_size: size,
            actual,
            actual_size: data.len() as u64,
        });
    }
    Ok(())
}

fn remote_index(
    entry: &SourceEntry,
    release: &Release,
    rel: &str,
    fetcher: &mut Fetcher,
    cache: Option<&Cache>,
) -> Result<Vec<u8>, RepoError> {
    let base = format!("{}/dists/{}", entry.uri, entry.suite);
    // Smallest download first, as apt does; a variant the mirror lacks is skipped.
    let variants: Vec<(String, &super::release::IndexEntry)> = [".xz", ".gz", ""]
        .iter()
        .filter_map(|ext| {
            let p = format!("{rel}{ext}");
            release.sha256.get(&p).map(|e| (p, e))
        })
        .collect();
    if variants.is_empty() {
        return Err(RepoError::MissingIndex {
            what: base,
            path: rel.to_string(),
        });
    }
    // Any variant already in the cache wins: a warm rerun needs no network.
    let cached = cache.and_then(|c| {
        variants
            .iter()
            .position(|(_, e)| c.get(&e.sha256).is_some())
    });
    let order: Vec<usize> = match cached {
        Some(i) => std::iter::once(i)
            .chain((0..variants.len()).filter(|&j| j != i))
            .collect(),
        None => (0..variants.len()).collect(),
    };
    let mut last_missing = None;
    for (path, e) in order.into_iter().map(|i| variants[i].clone()) {
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
        let mut urls = Vec::new();
        if release.acquire_by_hash {
            urls.push(format!("{base}/{dir}/by-hash/SHA256/{}", e.sha256));
        }
        urls.push(format!("{base}/{path}"));
        let mut raw = cache.and_then(|c| c.get(&e.sha256));
        let mut url = urls[0].clone();
        if raw.is_none() {
            for u in &urls {
                match fetcher.get(u) {
                    Ok(b) => {
                        url = u.clone();
                        raw = Some(b);
                        break;
                    }
                    Err(err @ FetchError::NotFound { .. }) => last_missing = Some(err),
                    Err(err) => return Err(err.into()),
                }
            }
        }
        let Some(raw) = raw else { continue };
        check_hash(&url, &raw, &e.sha256, e.size)?;
        if let Some(c) = cache {
            // A cache that cannot be written only costs the offline rerun.
            let _ = c.put(&e.sha256, &raw);
        }
        let data = decompress(&raw, Compression::from_name(&path)).map_err(|err| {
            RepoError::Decompress {
                what: url.clone(),
                message: err.to_string(),
            }
        })?;
        if let Some(plain) = release
            .sha256
            .get(rel)
            .filter(|_| !path.ends_with("Packages"))
        {
            check_hash(
                &format!("{url} (decompressed)"),
                &data,
                &plain.sha256,
                plain.size,
            )?;
        }
        return Ok(data);
    }
    Err(last_missing
        .map(RepoError::from)
        .unwrap_or(RepoError::MissingIndex {
            what: base,
            path: rel.to_string(),
        }))
}

fn lists_index(
    entry: &SourceEntry,
    dir: &Path,
    release: &Release,
    rel: &str,
) -> Result<Vec<u8>, RepoError> {
    let stem = format!(
        "{}/{}_{}",
        dir.display(),
        lists_prefix(entry),
        rel.replace('/', "_")
    );
    let plain = release
        .sha256
        .get(rel)
        .ok_or_else(|| RepoError::MissingIndex {
            what: format!("{} {}", entry.uri, entry.suite),
            path: rel.to_string(),
        })?;
    for ext in ["", ".lz4", ".gz", ".xz"] {
        let p = format!("{stem}{ext}");
        let Ok(raw) = std::fs::read(&p) else { continue };
        let data =
            decompress(&raw, Compression::from_name(&p)).map_err(|err| RepoError::Decompress {
                what: p.clone(),
                message: err.to_string(),
            })?;
        check_hash(&p, &data, &plain.sha256, plain.size)?;
        return Ok(data);
    }
    Err(RepoError::NotInLists {
        path: PathBuf::from(stem),
    })
}
