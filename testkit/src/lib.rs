//! Test support shared by the crates of the vse workspace (a dev-dependency only).
//!
//! - [`require`] / [`require!`]: the skip-or-fail rule. A test whose component is missing
//!   prints `skipped: …` and returns, or fails under `VSE_REQUIRE_ALL=1` (CI), where nothing
//!   may be skipped. Messages name the Debian package or the `.ci/` script that provides it.
//! - [`fixture`]: the guests and programs that `.ci/` scripts prepare (env files, env vars),
//!   and the guest's console counter.
//! - [`process`]: liveness (a zombie counts as dead), processes by command line, "no QEMU left".
//! - [`hog::Hog`]: a process holding memory inside a cgroup.
//! - [`apt`]: the host's apt lists, found through apt's own configuration.
//! - [`golden`]: golden files and the bless switch, refused under CI.
//! - [`nscluster`]: the Slurm cluster of namespace nodes, its nodes' processes and files.
//! - [`unpriv`]: the ordinary accounts attacks are run as (`.ci/tester-up.sh`).
//!
//! Depends on no crate of the workspace, so every crate (including the ones it would depend
//! on) can use it in its unit tests too.

pub mod apt;
pub mod fixture;
pub mod golden;
pub mod hog;
pub mod http;
pub mod nscluster;
pub mod process;
mod require;
pub mod unpriv;

pub use require::{have, is_root, missing, on_path, package_of, require, require_all, tool};

/// A scratch directory with a short path under `/tmp`: unix socket paths must stay below
/// 108 bytes, and `$TMPDIR` may be long.
pub fn short_tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("vse-{tag}-"))
        .tempdir_in("/tmp")
        .expect("create a directory under /tmp")
}
