//! Where vse keeps what it downloads and builds: one root for every cache (`.deb`s, indices,
//! the index cache, layers, images, admitted copies), resolved here and nowhere else.

use std::path::{Path, PathBuf};

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

/// The stores of whole images under the root: images built from specs, and the private copies
/// admission reads (`images.signed_by`, `srun --vse`).
pub const IMAGE_STORES: [&str; 2] = ["images", "admitted"];

/// The image store under [`cache_root`] that holds `image` directly, if one does: what the
/// policies' cache bounds may trim. Nothing else under the root is an image store (the test
/// images beside them, `.deb`s, indices, layers are not).
pub fn image_store_of(image: &Path) -> Option<PathBuf> {
    let root = cache_root();
    let parent = image.parent()?;
    IMAGE_STORES
        .iter()
        .map(|s| root.join(s))
        .find(|s| s == parent)
}
