//! Where vse keeps the run-time state of VMs and jobs (QEMU's sockets, consoles, profiles,
//! state databases, attach records): one root, resolved here and nowhere else.

use std::path::PathBuf;

/// The environment variable that names the root.
pub const ENV: &str = "VSE_RUN_DIR";
/// Root's root when [`ENV`] is unset or empty.
pub const SYSTEM_ROOT: &str = "/run/vse/v2m";

/// `$VSE_RUN_DIR`; unset or empty: [`SYSTEM_ROOT`] for root, and for any other user a place
/// of their own, since whoever can write there decides what vse connects to: the session's
/// `$XDG_RUNTIME_DIR/vse` (private, on tmpfs, gone at logout), else `/tmp/vse-run-UID`
/// (which vse creates 0700, and refuses if someone else made it first).
pub fn run_root() -> PathBuf {
    let set = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(root) = set(ENV) {
        return PathBuf::from(root);
    }
    let uid = crate::euid();
    if uid == 0 {
        return PathBuf::from(SYSTEM_ROOT);
    }
    set("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .map_or_else(
            || PathBuf::from(format!("/tmp/vse-run-{uid}")),
            |d| d.join("vse"),
        )
}
