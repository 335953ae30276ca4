//! One error for every benchmark: the measured components' own errors, kept whole so the
//! exit code follows their kind, and the benchmark's own failures.

use std::error::Error;
use thiserror::Error;
use vse_exit::{Classify, ErrorKind};

#[derive(Debug, Error)]
pub enum BenchError {
    /// The benchmark's options or inputs are wrong (exit code 2).
    #[error("{0}")]
    Invalid(String),
    /// A measured step did not give what the benchmark needs.
    #[error("{0}")]
    Failed(String),
    /// What the benchmark was doing when `source` happened.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<BenchError>,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Resolve(#[from] vsec::resolve::ResolveError),
    #[error(transparent)]
    Relation(#[from] vsec::deb::RelationError),
    #[error(transparent)]
    Lock(#[from] vsec::lock::LockError),
    #[error(transparent)]
    Pipeline(#[from] imgbuild::pipeline::PipelineError),
    #[error(transparent)]
    Image(#[from] vse_image::ImageError),
    #[error(transparent)]
    V2m(#[from] v2m::V2mError),
    #[error(transparent)]
    VmName(#[from] v2m::names::NameError),
    #[error(transparent)]
    Boot(#[from] vmhost::BootError),
    #[error(transparent)]
    Migrate(#[from] vmhost::MigrateError),
    #[error(transparent)]
    Agents(#[from] agents::bench::BenchError),
    #[error(transparent)]
    Fleet(#[from] launcher::fleet::FleetError),
    #[error(transparent)]
    Controller(#[from] control::state::ControllerError),
    #[error(transparent)]
    Barrier(#[from] control::migrate::BarrierError),
    #[error(transparent)]
    Config(#[from] control::migrate::ConfigError),
    #[error(transparent)]
    Coordinator(#[from] control::migrate::CoordError),
    #[error(transparent)]
    LiveMigration(#[from] control::migrate::MigrateError),
    #[error(transparent)]
    Monitor(#[from] monitor::MonitorError),
    #[error(transparent)]
    Id(#[from] monitor::IdError),
    #[error(transparent)]
    Checkpoint(#[from] launcher::ckpt::CkptError),
    #[error(transparent)]
    Link(#[from] vse_guest_agent::LinkError),
    /// The by-hand QMP baseline of `vse bench migrate`.
    #[error(transparent)]
    Qmp(#[from] crate::migrate::QmpError),
}

impl BenchError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }
}

/// `.context("what was being done")` on any result whose error becomes a [`BenchError`].
pub(crate) trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T, BenchError>;
}

impl<T, E: Into<BenchError>> Context<T> for Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }
}

impl From<std::io::Error> for BenchError {
    fn from(source: std::io::Error) -> Self {
        BenchError::Io {
            what: "I/O".into(),
            source,
        }
    }
}

impl Classify for BenchError {
    fn kind(&self) -> ErrorKind {
        match self {
            BenchError::Invalid(_) => ErrorKind::InvalidInput,
            BenchError::Failed(_) | BenchError::Io { .. } => ErrorKind::Internal,
            BenchError::Context { source, .. } => source.kind(),
            BenchError::Resolve(e) => e.kind(),
            BenchError::Relation(e) => e.kind(),
            BenchError::Lock(e) => e.kind(),
            BenchError::Pipeline(e) => e.kind(),
            BenchError::V2m(e) => e.kind(),
            // A wrapped error without a kind of its own takes its first classified cause's
            // (a missing QEMU under a boot error is still a missing component).
            other => cause_kind(other),
        }
    }
}

fn cause_kind(e: &BenchError) -> ErrorKind {
    let mut cur = e.source();
    while let Some(x) = cur {
        if let Some(v) = x.downcast_ref::<v2m::V2mError>() {
            return v.kind();
        }
        cur = x.source();
    }
    ErrorKind::Internal
}
