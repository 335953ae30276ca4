//! A lockfile checked before anything is built from it: a lock is a file its user can write,
//! so nothing in it is trusted but the names of what to install. Its repositories must be
//! the verified ones the policy stack gives (the archive allowed, mirror-rewritten and signed
//! with the stack's keyrings, `Valid-Until` honoured unless told otherwise), and each package
//! must be one those verified indices list for that Package/Version/Architecture with the
//! same file, size and SHA256. `packages.forbidden` and `packages.required` then run on the
//! indices' records (name, version, provides), never on what the lock claims. The build
//! fetches from the verified repositories' URLs, never from the lock's.
//!
//! The indices are loaded the way `vse lock` loads them ([`load_for_env`]): apt's lists
//! offline when they hold everything, the index cache, the same Release verification.

use super::env::{HostApt, load_for_env};
use super::request::ResolveError;
use crate::deb::{Arch, DebVersion, PackageName, Relation};
use crate::env::EffectiveEnv;
use crate::index::Package;
use crate::lock::{LockedPackage, LockedRepository, Lockfile, Reason};
use crate::repo::ValidityCheck;
use crate::solve::Catalog;
use std::fmt;
use std::path::{Path, PathBuf};

/// A package of a verified lock: every field from the verified index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPackage {
    pub name: PackageName,
    pub version: DebVersion,
    pub architecture: Arch,
    /// The verified repository's URL joined with the index's `Filename`.
    pub url: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
    /// The lock marks it as the kernel.
    pub kernel: bool,
}

/// A lockfile whose packages all passed [`verify_lock`], in the lock's order.
#[derive(Debug, Clone)]
pub struct VerifiedLock {
    pub lock: Lockfile,
    pub packages: Vec<VerifiedPackage>,
    /// Repositories whose Release file was re-signed since the lock was made (their URLs);
    /// the packages were found in today's verified indices all the same.
    pub resigned: Vec<String>,
}

/// Where a lock came from, for messages (`file:line`).
#[derive(Debug, Clone, Copy)]
pub struct LockSource<'a> {
    pub path: &'a Path,
    /// The lock's text, to find each `[[packages]]` table's line; `None`: no lines.
    pub text: Option<&'a str>,
}

/// Why one package of a lock is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackageProblem {
    NoRepository {
        index: usize,
        count: usize,
    },
    NotAllowed {
        url: String,
        policy: String,
        allowed: Vec<String>,
    },
    ForeignRepository {
        url: String,
        verified: Vec<String>,
    },
    NotInIndex {
        version: String,
        architecture: String,
        url: String,
        /// The lock's Release SHA256 and today's, when they differ.
        resigned: Option<(String, String)>,
    },
    OtherRepository {
        locked: String,
        index: String,
    },
    Sha256 {
        locked: String,
        index: String,
    },
    Size {
        locked: u64,
        index: u64,
    },
    Filename {
        locked: String,
        index: String,
    },
    Architecture {
        found: String,
        lock: String,
    },
    Forbidden {
        pattern: String,
        origin: String,
    },
}

impl fmt::Display for PackageProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PackageProblem as P;
        match self {
            P::NoRepository { index, count } => write!(
                f,
                "repository index {index} does not exist (the lock has {count})"
            ),
            P::NotAllowed {
                url,
                policy,
                allowed,
            } => write!(
                f,
                "its repository {url} is not allowed by {policy} (allowed: {})",
                allowed.join(", ")
            ),
            P::ForeignRepository { url, verified } => write!(
                f,
                "its repository {url} is not one of the verified repositories of this environment under its policies ({})",
                verified.join(", ")
            ),
            P::NotInIndex {
                version,
                architecture,
                url,
                resigned,
            } => {
                write!(
                    f,
                    "version {version} ({architecture}) is not in the verified index of {url}"
                )?;
                if let Some((locked, now)) = resigned {
                    write!(
                        f,
                        " (its Release was re-signed since the lock: SHA256 {locked} then, {now} now; name a snapshot to build an older lock)"
                    )?;
                }
                Ok(())
            }
            P::OtherRepository { locked, index } => write!(
                f,
                "the lock takes it from {locked}, the verified indices list it in {index}"
            ),
            P::Sha256 { locked, index } => write!(
                f,
                "the lock's SHA256 {locked} is not the {index} the verified index lists"
            ),
            P::Size { locked, index } => write!(
                f,
                "the lock's size {locked} is not the {index} bytes the verified index lists"
            ),
            P::Filename { locked, index } => write!(
                f,
                "the lock's file {locked} is not the {index} the verified index lists"
            ),
            P::Architecture { found, lock } => {
                write!(
                    f,
                    "architecture {found} is neither the lock's {lock} nor all"
                )
            }
            P::Forbidden { pattern, origin } => {
                write!(f, "forbidden (`{pattern}` by {origin})")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "{at}: package {package}: {problem}; hint: the lock was edited or is out of date, re-run `vse lock`"
    )]
    Package {
        /// `file` or `file:line`.
        at: String,
        package: String,
        problem: Box<PackageProblem>,
    },
    #[error(
        "{path}: {relation} is required by {origin} but not in the lock; hint: re-run `vse lock`"
    )]
    MissingRequired {
        path: PathBuf,
        relation: String,
        origin: String,
    },
    #[error("{path}: the kernel {kernel} ({origin}) is not in the lock; hint: re-run `vse lock`")]
    MissingKernel {
        path: PathBuf,
        kernel: String,
        origin: String,
    },
    #[error(
        "{path}: the lock is for architecture {lock}, the environment for {env}; hint: re-run `vse lock`"
    )]
    Architecture {
        path: PathBuf,
        lock: String,
        env: String,
    },
    #[error("{path}: verifying the lock's repositories: {error}")]
    Load {
        path: PathBuf,
        error: Box<ResolveError>,
    },
}

/// A lock that does not verify is the user's input (edited, stale or forged).
impl vse_exit::Classify for VerifyError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// What the environment asks of the lock beyond its packages' provenance.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect {
    /// The environment's kernel must be in the lock (the environment is the lock's own spec).
    pub kernel: bool,
}

/// Checks `lock` against the verified indices of `env`'s repositories (see the module).
pub fn verify_lock(
    lock: &Lockfile,
    src: LockSource,
    env: &EffectiveEnv,
    host: &HostApt,
    validity: ValidityCheck,
    expect: Expect,
) -> Result<VerifiedLock, VerifyError> {
    let env_arch = &env.base.architecture.value;
    if lock.architecture != *env_arch {
        return Err(VerifyError::Architecture {
            path: src.path.to_path_buf(),
            lock: lock.architecture.to_string(),
            env: env_arch.to_string(),
        });
    }
    let load_err = |e| VerifyError::Load {
        path: src.path.to_path_buf(),
        error: Box::new(e),
    };
    let mut loaded = load_for_env(env, host, validity, None).map_err(load_err)?;
    let mut checked = check_packages(lock, src, env, &*loaded.universe, &loaded.repositories);
    if let Some(why) = loaded.universe.fault() {
        // A damaged cache record voids every answer read from it: ask the indices again.
        super::cached::discard(&loaded.index_cache);
        drop(loaded.universe);
        loaded = load_for_env(env, host, validity, Some(&why)).map_err(load_err)?;
        checked = check_packages(lock, src, env, &*loaded.universe, &loaded.repositories);
    }
    let packages = checked?;
    check_required(lock, src, env, &packages, expect)?;
    let resigned = lock
        .repositories
        .iter()
        .filter(|r| {
            loaded
                .repositories
                .iter()
                .any(|v| same_url(&v.url, &r.url) && v.release_sha256 != r.release_sha256)
        })
        .map(|r| r.url.clone())
        .collect();
    Ok(VerifiedLock {
        lock: lock.clone(),
        packages: packages.into_iter().map(|(v, _)| v).collect(),
        resigned,
    })
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The 1-based line of each `[[packages]]` header, in order.
fn package_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == "[[packages]]")
        .map(|(i, _)| i + 1)
        .collect()
}

/// Each package checked; with its index record (for the required and kernel checks).
fn check_packages(
    lock: &Lockfile,
    src: LockSource,
    env: &EffectiveEnv,
    u: &dyn Catalog,
    verified: &[LockedRepository],
) -> Result<Vec<(VerifiedPackage, Package)>, VerifyError> {
    let lines = src.text.map(package_lines).unwrap_or_default();
    let mut out = Vec::with_capacity(lock.packages.len());
    for (i, p) in lock.packages.iter().enumerate() {
        match check_one(lock, p, env, u, verified) {
            Ok(v) => out.push(v),
            Err(problem) => {
                // Lines are only trusted when they pair up with the parsed packages.
                let at = match lines.get(i) {
                    Some(l) if lines.len() == lock.packages.len() => {
                        format!("{}:{l}", src.path.display())
                    }
                    _ => src.path.display().to_string(),
                };
                return Err(VerifyError::Package {
                    at,
                    package: p.name.to_string(),
                    problem: Box::new(problem),
                });
            }
        }
    }
    Ok(out)
}

fn check_one(
    lock: &Lockfile,
    p: &LockedPackage,
    env: &EffectiveEnv,
    u: &dyn Catalog,
    verified: &[LockedRepository],
) -> Result<(VerifiedPackage, Package), PackageProblem> {
    use PackageProblem as P;
    let repo = lock.repositories.get(p.repository).ok_or(P::NoRepository {
        index: p.repository,
        count: lock.repositories.len(),
    })?;
    if let Some(allowed) = &env.base.allowed_mirrors {
        let inside = crate::units::MirrorUrl::parse(repo.url.trim_end_matches('/'))
            .is_ok_and(|m| allowed.value.iter().any(|a| m.is_within(a)));
        if !inside {
            return Err(P::NotAllowed {
                url: repo.url.clone(),
                policy: allowed.from.to_string(),
                allowed: allowed.value.iter().map(|a| a.to_string()).collect(),
            });
        }
    }
    let Some(today) = verified.iter().find(|v| same_url(&v.url, &repo.url)) else {
        let mut urls: Vec<String> = verified.iter().map(|v| v.url.clone()).collect();
        urls.dedup();
        return Err(P::ForeignRepository {
            url: repo.url.clone(),
            verified: urls,
        });
    };
    if p.architecture != lock.architecture && p.architecture.as_str() != "all" {
        return Err(P::Architecture {
            found: p.architecture.to_string(),
            lock: lock.architecture.to_string(),
        });
    }
    let found = u
        .by_name(p.name.as_str())
        .iter()
        .map(|&id| u.package(id))
        .find(|q| q.version == p.version && q.architecture == p.architecture);
    let Some(q) = found else {
        let resigned = verified
            .iter()
            .filter(|v| same_url(&v.url, &repo.url))
            .all(|v| v.release_sha256 != repo.release_sha256)
            .then(|| (repo.release_sha256.clone(), today.release_sha256.clone()));
        return Err(P::NotInIndex {
            version: p.version.to_string(),
            architecture: p.architecture.to_string(),
            url: repo.url.clone(),
            resigned,
        });
    };
    // The same rule as the solver's, on the index's record.
    if let Some(f) = env
        .forbidden
        .iter()
        .find(|f| f.value.matches(&q.name, &q.version))
    {
        return Err(P::Forbidden {
            pattern: f.value.to_string(),
            origin: f.from.to_string(),
        });
    }
    if !p.sha256.eq_ignore_ascii_case(&q.sha256) {
        return Err(P::Sha256 {
            locked: p.sha256.clone(),
            index: q.sha256.clone(),
        });
    }
    if p.size != q.size {
        return Err(P::Size {
            locked: p.size,
            index: q.size,
        });
    }
    if p.filename.trim_start_matches('/') != q.filename.trim_start_matches('/') {
        return Err(P::Filename {
            locked: p.filename.clone(),
            index: q.filename.clone(),
        });
    }
    let from = verified.get(q.repository).map_or("", |v| v.url.as_str());
    if !same_url(from, &repo.url) {
        return Err(P::OtherRepository {
            locked: repo.url.clone(),
            index: from.to_string(),
        });
    }
    let v = VerifiedPackage {
        name: q.name.clone(),
        version: q.version.clone(),
        architecture: q.architecture.clone(),
        url: format!(
            "{}/{}",
            from.trim_end_matches('/'),
            q.filename.trim_start_matches('/')
        ),
        size: q.size,
        sha256: q.sha256.to_ascii_lowercase(),
        kernel: p.reason == Reason::Kernel,
    };
    Ok((v, q.clone()))
}

/// A verified record meets `r` by its own name and version, or by what it provides.
fn meets(r: &Relation, q: &Package) -> bool {
    let real = q.name == r.name && r.constraint.as_ref().is_none_or(|c| c.matches(&q.version));
    real || q.provides.iter().any(|pv| {
        pv.name == r.name
            && match (&r.constraint, &pv.constraint) {
                (None, _) => true,
                (Some(c), Some(pc)) => c.matches(&pc.version),
                (Some(_), None) => false,
            }
    })
}

fn check_required(
    lock: &Lockfile,
    src: LockSource,
    env: &EffectiveEnv,
    packages: &[(VerifiedPackage, Package)],
    expect: Expect,
) -> Result<(), VerifyError> {
    for r in &env.required_packages {
        if !packages.iter().any(|(_, q)| meets(&r.value, q)) {
            return Err(VerifyError::MissingRequired {
                path: src.path.to_path_buf(),
                relation: r.value.to_string(),
                origin: r.from.to_string(),
            });
        }
    }
    if expect.kernel {
        let k = &env.kernel;
        let marked = lock
            .packages
            .iter()
            .zip(packages)
            .any(|(l, (_, q))| l.reason == Reason::Kernel && q.name == k.value);
        if !marked {
            return Err(VerifyError::MissingKernel {
                path: src.path.to_path_buf(),
                kernel: k.value.to_string(),
                origin: k.from.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_headers_are_found_by_line() {
        let text = "format = 1\n\n[[packages]]\nname = \"a\"\n\n  [[packages]]\nname = \"b\"\n";
        assert_eq!(package_lines(text), vec![3, 6]);
    }

    #[test]
    fn problems_name_the_reason() {
        let p = PackageProblem::Sha256 {
            locked: "aa".into(),
            index: "bb".into(),
        };
        assert!(p.to_string().contains("SHA256 aa"), "{p}");
        let p = PackageProblem::ForeignRepository {
            url: "http://127.0.0.1:1/debian".into(),
            verified: vec!["http://deb.debian.org/debian".into()],
        };
        assert!(p.to_string().contains("127.0.0.1"), "{p}");
    }
}
