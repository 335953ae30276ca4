//! From an [`EffectiveEnv`] to what the resolver needs: the request (packages and why they
//! are there, forbidden patterns, base variant, recommends) and the repositories.
//!
//! Repositories follow the rule users of apt expect on a cluster: unless the spec or a
//! policy names an archive, the mirrors configured for apt on this host are used (HPC sites
//! run local mirrors; that is the embedded default), restricted to the spec's suite and its
//! `-updates`/`-security` companions. `-backports` is left out because apt itself only
//! installs from it when asked. A policy's mirror rewrite applies to every source.

use super::cached::{IndexCacheNote, discard, load_universe_cached};
use super::request::{
    BaseVariant, RepoConfig, RequestedPackage, ResolveError, ResolveRequest, resolve_in,
};
use crate::deb::{Arch, PackageName, Relation, parse_relation};
use crate::env::{EffectiveEnv, Origin, Sourced, Variant};
use crate::lock::{LockedRepository, Lockfile, Reason, SourceFiles};
use crate::repo::{
    Cache, Location, RepoError, RetryPolicy, SignedBy, SourceEntry, SourcesError, ValidityCheck,
    host_sources,
};
use crate::solve::Catalog;
use std::path::{Path, PathBuf};

/// The static busybox the initramfs runs on.
pub const INITRAMFS_PACKAGE: &str = "busybox-static";

/// Debian's archive keyring: used when neither the spec nor a policy names keyrings.
pub const DEFAULT_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Where the host keeps apt's configuration and downloaded lists (tests point elsewhere).
#[derive(Debug, Clone)]
pub struct HostApt {
    /// Root under which `etc/apt/sources.list{,.d}` are read (normally `/`).
    pub root: PathBuf,
    /// apt's lists directory (normally `/var/lib/apt/lists`).
    pub lists: PathBuf,
}

impl Default for HostApt {
    fn default() -> Self {
        HostApt {
            root: PathBuf::from("/"),
            lists: PathBuf::from("/var/lib/apt/lists"),
        }
    }
}

impl HostApt {
    /// This host's apt, with the lists directory apt itself uses (`Dir::State::lists`, from
    /// `apt-config`, which honours `APT_CONFIG` and `apt.conf.d`); the default when apt-config
    /// is not there.
    pub fn detect() -> Self {
        let mut host = HostApt::default();
        if let Some(lists) = apt_config_dir("Dir::State::lists/d") {
            host.lists = lists;
        }
        host
    }
}

/// A directory setting of apt's configuration (`apt-config shell V NAME/d`).
fn apt_config_dir(name: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("apt-config")
        .args(["shell", "V", name])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix("V='")?.strip_suffix('\''))?;
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

/// The request for an environment; `extra` are one-off additions (`vse lock --add`).
pub fn request_for_env(env: &EffectiveEnv, extra: &[Relation]) -> ResolveRequest {
    let mut packages = Vec::new();
    let kernel = &env.kernel.value;
    packages.push(RequestedPackage {
        relation: parse_relation(kernel.as_str()).expect("a package name is a relation"),
        reason: Reason::Kernel,
    });
    for p in &env.packages {
        packages.push(RequestedPackage {
            relation: p.value.clone(),
            reason: reason_of(p, Reason::Requested),
        });
    }
    for p in &env.required_packages {
        packages.push(RequestedPackage {
            relation: p.value.clone(),
            reason: reason_of(p, Reason::Requested),
        });
    }
    // The initramfs that lets one image boot under every hypervisor runs on busybox-static
    // (imgbuild copies it from the image); ask for it unless the spec already does.
    let initramfs = PackageName::new(INITRAMFS_PACKAGE).expect("valid literal");
    if !packages.iter().any(|p| p.relation.name == initramfs) {
        packages.push(RequestedPackage {
            relation: parse_relation(INITRAMFS_PACKAGE).expect("valid literal"),
            reason: Reason::Initramfs,
        });
    }
    for r in extra {
        packages.push(RequestedPackage {
            relation: r.clone(),
            reason: Reason::Requested,
        });
    }
    ResolveRequest {
        variant: match env.base.variant.value {
            Variant::Essential => BaseVariant::Essential,
            Variant::Minbase => BaseVariant::Minbase,
            Variant::Standard => BaseVariant::Standard,
        },
        recommends: env.base.install_recommends.value,
        packages,
        forbidden: env
            .forbidden
            .iter()
            .map(|f| (f.value.clone(), f.from.to_string()))
            .collect(),
    }
}

/// A package a policy imposes is there because of that policy (named by its file).
fn reason_of<T>(s: &Sourced<T>, otherwise: Reason) -> Reason {
    match &s.from {
        Origin::Policy { at } => Reason::Policy {
            policy: Path::new(&*at.file)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| at.file.to_string()),
        },
        _ => otherwise,
    }
}

/// How the repositories of an environment are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoSelection {
    /// The host's apt sources for the suite, read from apt's lists (no network).
    HostLists,
    /// The host's apt sources for the suite, fetched from the mirrors.
    HostRemote,
    /// The archive named by the spec or a policy, fetched from it.
    Named,
}

/// Repository configuration for an environment. `prefer` is tried first by the caller;
/// see [`repos_for_env`] for the fallback order.
pub fn repo_config(
    env: &EffectiveEnv,
    host: &HostApt,
    selection: RepoSelection,
    validity: ValidityCheck,
) -> Result<RepoConfig, SourcesError> {
    let b = &env.base;
    let suite = b.suite.value.as_str();
    let components: Vec<String> = b
        .components
        .value
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    let keyrings: Vec<PathBuf> = if b.keyrings.value.is_empty() {
        vec![PathBuf::from(DEFAULT_KEYRING)]
    } else {
        b.keyrings
            .value
            .iter()
            .map(|k| PathBuf::from(k.as_str()))
            .collect()
    };
    let sources = match selection {
        RepoSelection::Named => b
            .mirror
            .iter()
            .map(|m| SourceEntry {
                uri: m.value.as_str().trim_end_matches('/').to_string(),
                suite: suite.to_string(),
                components: components.clone(),
                signed_by: SignedBy::Default,
                origin: m.from.to_string(),
            })
            .collect(),
        RepoSelection::HostLists | RepoSelection::HostRemote => host_sources(&host.root)?
            .into_iter()
            .filter(|s| in_suite_family(&s.suite, suite))
            .map(|mut s| {
                // The spec's components decide; the host's entry decides where and how.
                s.components = components.clone();
                s
            })
            .collect(),
    };
    Ok(RepoConfig {
        sources,
        location: match selection {
            RepoSelection::HostLists => Location::AptLists(host.lists.clone()),
            _ => Location::Remote,
        },
        // The archive named by the spec or a policy is fetched as named (a policy's mirror
        // replaces the spec's before this point), so nothing is left to rewrite.
        mirror_rewrites: Vec::new(),
        arch: b.architecture.value.clone(),
        keyrings,
        validity,
        snapshot: b.snapshot.as_ref().map(|s| s.value.clone()),
        cache_dir: Cache::default_dir(),
        index_cache: Some(super::cached::default_index_cache_dir()),
        retry: RetryPolicy::default(),
    })
}

/// `bookworm`, `bookworm-updates`, `bookworm-security` — not `bookworm-backports`.
fn in_suite_family(candidate: &str, suite: &str) -> bool {
    candidate == suite
        || candidate
            .strip_prefix(suite)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|kind| kind != "backports")
}

/// The order in which repository selections are tried for an environment: an archive named
/// by the spec or a policy is used as named; otherwise the host's apt sources, from the
/// lists apt already verified and downloaded (offline), then from the network. No selection
/// at all: the host has no apt source for the suite and nothing names an archive.
pub fn repo_selections(env: &EffectiveEnv, host: &HostApt) -> Vec<RepoSelection> {
    let has_host = host_sources(&host.root)
        .map(|v| {
            v.iter()
                .any(|s| in_suite_family(&s.suite, env.base.suite.value.as_str()))
        })
        .unwrap_or(false);
    match (
        env.base.mirror.is_some(),
        has_host,
        env.base.snapshot.is_some(),
    ) {
        (true, _, _) => vec![RepoSelection::Named],
        (false, false, _) => vec![],
        // apt's lists hold today's indices, not a snapshot's.
        (false, true, true) => vec![RepoSelection::HostRemote],
        (false, true, false) => vec![RepoSelection::HostLists, RepoSelection::HostRemote],
    }
}

/// The repositories of an environment, loaded and verified.
pub struct LoadedEnv {
    pub universe: Box<dyn Catalog>,
    pub repositories: Vec<LockedRepository>,
    pub selection: RepoSelection,
    pub index_cache: IndexCacheNote,
    /// The cache file left to write (writes deferred, see [`super::defer_writes`]).
    pub pending: Option<super::PendingCache>,
}

/// Loads and verifies the environment's repositories, trying [`repo_selections`] in order:
/// apt's lists are used when they hold everything needed, else the mirrors are fetched.
/// The index cache is used; `rebuild` ignores its file (with that reason).
pub fn load_for_env(
    env: &EffectiveEnv,
    host: &HostApt,
    validity: ValidityCheck,
    rebuild: Option<&str>,
) -> Result<LoadedEnv, ResolveError> {
    let selections = repo_selections(env, host);
    if selections.is_empty() {
        return Err(ResolveError::NoHostSource {
            suite: env.base.suite.value.to_string(),
        });
    }
    let mut last = None;
    for sel in selections {
        let cfg = repo_config(env, host, sel, validity).map_err(RepoError::from)?;
        check_allowed(env, &cfg)?;
        match load_universe_cached(&cfg, rebuild) {
            Ok(l) => {
                return Ok(LoadedEnv {
                    universe: l.universe,
                    repositories: l.repositories,
                    selection: sel,
                    index_cache: l.note,
                    pending: l.pending,
                });
            }
            // Lists that lack a file (another component, a rewritten mirror): fetch instead.
            Err(ResolveError::Repo(
                e @ (RepoError::NotInLists { .. } | RepoError::MissingIndex { .. }),
            )) if sel == RepoSelection::HostLists => last = Some(ResolveError::Repo(e)),
            Err(ResolveError::NoSources) if sel != RepoSelection::Named => {
                last = Some(ResolveError::NoSources)
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(ResolveError::NoSources))
}

/// Every archive of `cfg` lies within the policies' `repositories.allowed`.
fn check_allowed(env: &EffectiveEnv, cfg: &RepoConfig) -> Result<(), ResolveError> {
    let Some(allowed) = &env.base.allowed_mirrors else {
        return Ok(());
    };
    for s in &cfg.sources {
        let inside = crate::units::MirrorUrl::parse(&s.uri)
            .is_ok_and(|u| allowed.value.iter().any(|a| u.is_within(a)));
        if !inside {
            return Err(ResolveError::NotAllowed {
                uri: s.uri.clone(),
                origin: s.origin.clone(),
                policy: allowed.from.to_string(),
                allowed: allowed.value.iter().map(|a| a.to_string()).collect(),
            });
        }
    }
    Ok(())
}

/// A lock made from an environment, and how the repositories were read.
#[derive(Debug)]
pub struct LockOutcome {
    pub lock: Lockfile,
    pub selection: RepoSelection,
    pub index_cache: IndexCacheNote,
    /// The index cache file still to write (writes deferred, see [`super::defer_writes`]).
    pub deferred: Option<super::DeferredCache>,
}

/// Resolves an environment into a lockfile (not written): what `vse lock` and
/// `vse build SPEC` do. `source` names the spec and policies relative to the lock's directory.
pub fn lock_env(
    env: &EffectiveEnv,
    extra: &[Relation],
    host: &HostApt,
    validity: ValidityCheck,
    source: SourceFiles,
) -> Result<LockOutcome, ResolveError> {
    let req = request_for_env(env, extra);
    let mut loaded = load_for_env(env, host, validity, None)?;
    let res = match resolve_in(&*loaded.universe, &req) {
        Err(ResolveError::DamagedCache(why)) => {
            // The answer is void: resolve again from the verified indices.
            discard(&loaded.index_cache);
            drop(loaded.universe);
            loaded = load_for_env(env, host, validity, Some(&why))?;
            resolve_in(&*loaded.universe, &req)?
        }
        r => r?,
    };
    // A parsed universe is millions of small allocations: freeing them takes longer than
    // solving. Nothing waits for that (a process that exits first just ends the thread).
    let universe = loaded.universe;
    let deferred = match loaded.pending {
        Some(pending) => Some(super::DeferredCache { universe, pending }),
        None => {
            std::thread::spawn(move || drop(universe));
            None
        }
    };
    Ok(LockOutcome {
        lock: res.into_lockfile(env.env_hash(), source, arch_of(env), loaded.repositories),
        selection: loaded.selection,
        index_cache: loaded.index_cache,
        deferred,
    })
}

/// The architecture an environment is resolved for.
pub fn arch_of(env: &EffectiveEnv) -> Arch {
    env.base.architecture.value.clone()
}

#[cfg(test)]
mod tests {
    use super::in_suite_family;

    #[test]
    fn suite_family_keeps_updates_and_security_but_not_backports() {
        assert!(in_suite_family("bookworm", "bookworm"));
        assert!(in_suite_family("bookworm-updates", "bookworm"));
        assert!(in_suite_family("bookworm-security", "bookworm"));
        assert!(!in_suite_family("bookworm-backports", "bookworm"));
        assert!(!in_suite_family("bullseye", "bookworm"));
        assert!(!in_suite_family("bookwormx", "bookworm"));
    }
}
