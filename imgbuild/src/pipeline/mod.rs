//! From a spec to an image: the spec and its stacked policies merged into an
//! [`EffectiveEnv`](vsec::env::EffectiveEnv) ([`env`]), resolved into a lockfile ([`lock`]),
//! the lock's image built and customised from the spec it names ([`image`]), and the
//! content-addressed image store of `vse launch SPEC` and `srun --vse=SPEC` ([`store`]).
//! `vse check|lock|build|import`, `vse spank` and `vse bench build` call these and only draw
//! progress and print results.

pub mod env;
mod error;
pub mod image;
pub mod lock;
pub mod store;

pub use env::{EnvError, is_spec, load_env, load_policies, merge_files, relative_to};
pub use error::PipelineError;
pub use image::{BuildRequest, Built, build_lock, policy_refs, to_customization};
pub use lock::{LockCheck, LockRequest, check_lock, lock_kernel, lock_spec, resolve, write_lock};
pub use store::ImageStore;

use crate::progress::{Progress, Silent};

/// What a caller sees of the pipeline's work. Resolving emits no events of its own (a CLI
/// shows a spinner between the two calls); building emits imgbuild's progress events.
pub trait Report: Sync {
    /// Resolving starts (`true`) or has ended (`false`).
    fn resolving(&self, _active: bool) {}
    /// Where the build's events go.
    fn build(&self) -> &dyn Progress;
}

impl Report for Silent {
    fn build(&self) -> &dyn Progress {
        self
    }
}
