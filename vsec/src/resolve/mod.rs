//! Glue: a [`ResolveRequest`] → verified repositories → the solver → locked packages.
//!
//! Loading ([`load_universe`]) and solving ([`resolve_in`]) are separate so that a caller can
//! solve many requests against one parsed index (the benchmark and the apt-oracle tests do).

pub mod apt;
mod background;
mod cached;
mod check;
mod env;
mod request;
mod verify;

pub use background::DeferredCache;
pub use cached::{
    CachedLoad, IndexCacheNote, PendingCache, default_index_cache_dir, defer_writes,
    load_universe_cached,
};
pub use check::{LockDifference, compare_locks};
pub use env::{
    DEFAULT_KEYRING, HostApt, LoadedEnv, LockOutcome, RepoSelection, arch_of, load_for_env,
    lock_env, repo_config, repo_selections, request_for_env,
};
pub use request::{
    BaseVariant, RepoConfig, RequestedPackage, Resolution, ResolveError, ResolveRequest,
    base_names, load_universe, resolve, resolve_in,
};
pub use verify::{
    Expect, LockSource, PackageProblem, VerifiedLock, VerifiedPackage, VerifyError, verify_lock,
};
