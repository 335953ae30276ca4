//! The lockfile: every package an image will contain, pinned by version and SHA256.
//!
//! It is TOML so that a change of environment shows as a readable diff. The image builder
//! reads only this (plus the spec and policies it names, re-checked by `env_hash`), and
//! trusts none of its URLs, sizes or hashes: `crate::resolve::verify_lock` finds every package
//! in the verified indices of the policy stack first.

mod model;

pub use model::{
    LOCK_FORMAT, LockError, LockedPackage, LockedRepository, Lockfile, MAX_LOCK_BYTES, Reason,
    SourceFiles,
};
