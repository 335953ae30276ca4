//! Where vse keeps what it downloads and builds: one root for every cache (`.deb`s, indices,
//! the index cache, layers, images, admitted copies), resolved here and nowhere else.

use std::path::PathBuf;

/// The environment variable that names the root.
pub const ENV: &str = "VSE_CACHE";
/// Root's root when [`ENV`] is unset or empty.
pub const SYSTEM_ROOT: &str = "/var/cache/vse";

/// `$VSE_CACHE`; unset or empty: [`SYSTEM_ROOT`] for root, and for any other user a cache
/// of their own (`$XDG_CACHE_HOME/vse`, else `~/.cache/vse`), since a cache must be private
/// to the user who trusts it.
pub fn cache_root() -> PathBuf {
    let set = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(root) = set(ENV) {
        return PathBuf::from(root);
    }
    if crate::euid() == 0 {
        return PathBuf::from(SYSTEM_ROOT);
    }
    set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map_or_else(|| PathBuf::from(SYSTEM_ROOT), |d| d.join("vse"))
}
