//! An effective environment resolved against the Debian repositories into a lockfile: for
//! `vse lock` (write, or `--check` against the lock on disk), `vse build SPEC` (locks first)
//! and `vse import` (the lock that gives an imported image its kernel).

use super::{PipelineError, Report, load_env, relative_to};
use std::path::{Path, PathBuf};
use vsec::deb::Relation;
use vsec::env::EffectiveEnv;
use vsec::lock::{Lockfile, SourceFiles};
use vsec::repo::ValidityCheck;
use vsec::resolve::{
    Expect, HostApt, LockDifference, LockOutcome, LockSource, VerifiedLock, compare_locks,
    lock_env, verify_lock,
};

/// What to resolve for whom.
#[derive(Debug, Clone, Copy)]
pub struct LockRequest<'a> {
    pub spec: &'a Path,
    pub policies: &'a [PathBuf],
    /// Where the lock goes: it names the spec and policies relative to its directory.
    pub lock_path: &'a Path,
    /// Accept Release files past their Valid-Until (an old mirror snapshot).
    pub allow_expired: bool,
}

/// Resolves `env` (from `req`'s spec and policies, plus `extra` for this resolution only)
/// against the host's apt sources or the archive the environment names. Nothing is written.
pub fn resolve(
    env: &EffectiveEnv,
    req: &LockRequest,
    extra: &[Relation],
    report: &dyn Report,
) -> Result<LockOutcome, PipelineError> {
    let lock_dir = req
        .lock_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let source = SourceFiles {
        spec: relative_to(req.spec, lock_dir),
        policies: req
            .policies
            .iter()
            .map(|p| relative_to(p, lock_dir))
            .collect(),
    };
    let validity = if req.allow_expired {
        ValidityCheck::Ignore
    } else {
        ValidityCheck::Now
    };
    report.resolving(true);
    let r = lock_env(env, extra, &HostApt::detect(), validity, source);
    report.resolving(false);
    r.map_err(|error| PipelineError::Resolve {
        spec: req.spec.to_path_buf(),
        error: Box::new(error),
    })
}

/// Writes `lock` atomically.
pub fn write_lock(lock: &Lockfile, path: &Path) -> Result<(), PipelineError> {
    lock.write(path).map_err(|source| PipelineError::WriteLock {
        path: path.to_path_buf(),
        source,
    })
}

/// `vse build SPEC`'s first step: the spec under its policies resolved into `out`, as
/// `vse lock` would.
pub fn lock_spec(
    spec: &Path,
    policies: &[PathBuf],
    out: &Path,
    allow_expired: bool,
    report: &dyn Report,
) -> Result<Lockfile, PipelineError> {
    let env = load_env(spec, policies)?;
    // `vse build SPEC` locks first: a sandbox that cannot run is refused before resolving.
    crate::rootfs::idbase::check_for_this_process()?;
    let req = LockRequest {
        spec,
        policies,
        lock_path: out,
        allow_expired,
    };
    let lock = resolve(&env, &req, &[], report)?.lock;
    write_lock(&lock, out)?;
    Ok(lock)
}

/// How a lock on disk compares with a fresh resolution.
#[derive(Debug, Clone)]
pub struct LockCheck {
    /// What makes the lock wrong today (empty: up to date).
    pub stale: Vec<LockDifference>,
    /// The repositories were re-signed since; alone, this does not make the lock stale.
    pub repositories_changed: bool,
}

impl LockCheck {
    pub fn up_to_date(&self) -> bool {
        self.stale.is_empty()
    }
}

/// Compares the lock at `path` with `now`, resolved from the same spec and policies.
pub fn check_lock(path: &Path, now: &Lockfile) -> Result<LockCheck, PipelineError> {
    let locked = Lockfile::read(path).map_err(|error| PipelineError::NoLockToCheck { error })?;
    Ok(judge(compare_locks(&locked, now)))
}

fn judge(diffs: Vec<LockDifference>) -> LockCheck {
    let all = diffs.len();
    // A newer Release file alone (security suites are re-signed daily) does not make the
    // lock wrong: the packages it pins are what resolving gives today.
    let stale: Vec<LockDifference> = diffs
        .into_iter()
        .filter(|d| !matches!(d, LockDifference::Repositories))
        .collect();
    LockCheck {
        repositories_changed: stale.len() != all,
        stale,
    }
}

/// The lock that gives an image made elsewhere (`vse import`) its kernel and initramfs:
/// `from` as given (a lockfile, or a spec resolved under `policies`), else the default kernel
/// of an environment on the host's own Debian suite, resolved under `policies` against the
/// host's apt sources exactly as `vse lock` would. A lockfile is verified under `policies`
/// like `vse build LOCK --packages-only` verifies one (so is a fresh lock: one path for all).
pub fn lock_kernel(
    from: Option<&Path>,
    policies: &[PathBuf],
    allow_expired: bool,
    report: &dyn Report,
) -> Result<VerifiedLock, PipelineError> {
    let scratch = std::env::temp_dir().join("vse-import.lock");
    let validity = if allow_expired {
        ValidityCheck::Ignore
    } else {
        ValidityCheck::Now
    };
    let verify = |lock: Lockfile, env: &EffectiveEnv, path: &Path| {
        let src = LockSource { path, text: None };
        report.resolving(true);
        let v = verify_lock(
            &lock,
            src,
            env,
            &HostApt::detect(),
            validity,
            Expect::default(),
        );
        report.resolving(false);
        v.map_err(|e| PipelineError::Verify(Box::new(e)))
    };
    let resolve_env = |env: &EffectiveEnv, spec: &Path| -> Result<VerifiedLock, PipelineError> {
        let req = LockRequest {
            spec,
            policies,
            lock_path: &scratch,
            allow_expired,
        };
        let lock = resolve(env, &req, &[], report)?.lock;
        verify(lock, env, spec)
    };
    match from {
        Some(p) if super::is_spec(p) => resolve_env(&load_env(p, policies)?, p),
        Some(p) => {
            let lock = Lockfile::read(p).map_err(|error| PipelineError::KernelLock { error })?;
            let base = p.parent().unwrap_or(Path::new("."));
            let env = super::image::packages_only_env(base, &lock, p, load_all(policies)?)?;
            verify(lock, &env, p)
        }
        None => {
            let name = "<vse import: default kernel>";
            resolve_env(&default_kernel_env(name, policies)?, Path::new(name))
        }
    }
}

fn load_all(policies: &[PathBuf]) -> Result<Vec<vsec::policy::Policy>, PipelineError> {
    policies
        .iter()
        .map(|p| vsec::policy::load(p).map_err(|error| PipelineError::KernelPolicy { error }))
        .collect()
}

/// A minimal environment on the host's Debian suite (the first apt source without a `-`
/// suffix), merged with `policies`.
fn default_kernel_env(name: &str, policies: &[PathBuf]) -> Result<EffectiveEnv, PipelineError> {
    let suite = vsec::repo::host_sources(Path::new("/"))
        .ok()
        .and_then(|s| s.into_iter().map(|e| e.suite).find(|s| !s.contains('-')))
        .ok_or(PipelineError::NoHostSuite)?;
    let yaml = format!(
        "version: 1\nname: imported\nbase:\n  distribution: debian\n  suite: {suite}\n  variant: essential\n"
    );
    let src = vsec::yaml::Source::from_bytes(name, Path::new("."), yaml.into_bytes());
    let spec = vsec::spec::parse_source(&src).map_err(PipelineError::KernelSpec)?;
    vsec::merge::merge(&spec, &load_all(policies)?)
        .map_err(|problems| PipelineError::KernelEnv { suite, problems })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn re_signed_repositories_alone_leave_the_lock_up_to_date() {
        let c = judge(vec![LockDifference::Repositories]);
        assert!(c.up_to_date() && c.repositories_changed);
        let c = judge(vec![
            LockDifference::Repositories,
            LockDifference::Added("tree".into()),
        ]);
        assert!(!c.up_to_date() && c.repositories_changed);
        assert_eq!(c.stale.len(), 1);
        let c = judge(vec![]);
        assert!(c.up_to_date() && !c.repositories_changed);
    }
}
