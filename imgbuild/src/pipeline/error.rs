//! The pipeline's errors. Each says what was being done with which file, and classifies
//! itself by the error it wraps, so the CLI's exit code follows the cause.

use super::EnvError;
use crate::build::BuildError;
use crate::from_lock::FromLockError;
use std::path::PathBuf;
use thiserror::Error;
use vse_exit::{Classify, ErrorKind};
use vsec::lock::LockError;
use vsec::resolve::ResolveError;
use vsec::yaml::{Diagnostics, YamlError};

#[derive(Debug, Error)]
pub enum PipelineError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    IdBase(#[from] crate::rootfs::idbase::IdBaseError),
    #[error("resolving {}: {error}", spec.display())]
    Resolve {
        spec: PathBuf,
        error: Box<ResolveError>,
    },
    #[error("writing {}", path.display())]
    WriteLock {
        path: PathBuf,
        #[source]
        source: LockError,
    },
    #[error("cannot read lockfile {}: {error}", path.display())]
    ReadLock {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: lockfile is not UTF-8", path.display())]
    LockNotUtf8 { path: PathBuf },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{}: {error}", path.display())]
    Plan { path: PathBuf, error: FromLockError },
    #[error(transparent)]
    Verify(Box<vsec::resolve::VerifyError>),
    #[error(transparent)]
    Cache(crate::fetch::FetchError),
    #[error("{}: cannot verify the lock without its spec: {what}; hint: re-run `vse lock`", path.display())]
    LockWithoutEnv { path: PathBuf, what: String },
    #[error("spec {} named by the lock: {error}; hint: pass --packages-only to build without it", path.display())]
    LockedSpec { path: PathBuf, error: YamlError },
    #[error("policy {} named by the lock: {error}", path.display())]
    LockedPolicy { path: PathBuf, error: YamlError },
    #[error("cannot read policy {}: {error}", path.display())]
    PolicyRead {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Merge(#[from] Diagnostics),
    #[error(
        "{} or its policies changed since the lock was made (env hash {now} ≠ lock's {locked}); hint: re-run `vse lock`",
        spec.display()
    )]
    EnvChanged {
        spec: PathBuf,
        now: String,
        locked: String,
    },
    #[error("file {file} ({origin}): cannot read source {}: {error}; hint: a spec copies regular files from its own directory, named without `..` and reached through no symlink", path.display())]
    FileSource {
        file: String,
        origin: String,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "file {file} ({origin}): {what} {name:?} is neither root nor declared in the spec's users/groups"
    )]
    UnknownOwner {
        file: String,
        origin: String,
        what: &'static str,
        name: String,
    },
    #[error("building {} from {}", out.display(), input.display())]
    Build {
        out: PathBuf,
        input: PathBuf,
        #[source]
        source: Box<BuildError>,
    },
    #[error("creating {}; hint: set VSE_CACHE to a writable directory", dir.display())]
    Store {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `vse lock --check` without a lock to check.
    #[error("{error}; hint: run `vse lock` without --check to create it")]
    NoLockToCheck { error: LockError },
    /// The lock `--kernel-from` names.
    #[error("{error}")]
    KernelLock { error: LockError },
    #[error(
        "this host has no apt source for a Debian suite to take a kernel from; hint: pass --kernel-from LOCK|SPEC"
    )]
    NoHostSuite,
    #[error("{0}")]
    KernelSpec(Diagnostics),
    #[error("{error}")]
    KernelPolicy { error: YamlError },
    #[error(
        "the default kernel environment ({suite}) under the policies:\n{problems}\nhint: pass --kernel-from LOCK|SPEC"
    )]
    KernelEnv {
        suite: String,
        problems: Diagnostics,
    },
}

impl PipelineError {
    /// The diagnostics to show the user (file:line:column each) before the summary, if any.
    pub fn diagnostics(&self) -> Option<&Diagnostics> {
        match self {
            PipelineError::Env(e) => e.diagnostics(),
            _ => None,
        }
    }
}

impl Classify for PipelineError {
    fn kind(&self) -> ErrorKind {
        use PipelineError as E;
        match self {
            E::Env(e) => e.kind(),
            E::IdBase(e) => e.kind(),
            E::Resolve { error, .. } => error.kind(),
            E::WriteLock { source, .. } => source.kind(),
            E::Lock(e) | E::NoLockToCheck { error: e } => e.kind(),
            E::Plan { error, .. } => error.kind(),
            E::Verify(e) => e.kind(),
            E::Cache(crate::fetch::FetchError::Unsafe(u)) => u.kind(),
            E::Cache(_) => ErrorKind::Internal,
            E::LockedSpec { error, .. } | E::LockedPolicy { error, .. } => error.kind(),
            E::Merge(d) => d.kind(),
            E::Build { source, .. } => source.kind(),
            E::Store { .. } => ErrorKind::Internal,
            E::ReadLock { .. }
            | E::LockNotUtf8 { .. }
            | E::EnvChanged { .. }
            | E::LockWithoutEnv { .. }
            | E::PolicyRead { .. }
            | E::FileSource { .. }
            | E::UnknownOwner { .. }
            | E::KernelLock { .. }
            | E::NoHostSuite
            | E::KernelSpec(_)
            | E::KernelPolicy { .. }
            | E::KernelEnv { .. } => ErrorKind::InvalidInput,
        }
    }
}
