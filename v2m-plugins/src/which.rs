//! `PATH` lookup for the hypervisor tools the plugins drive or probe for.

use std::path::{Path, PathBuf};

/// Bare names are searched in `PATH`; paths are taken as given. Must be an executable file.
pub fn find_binary(name: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let ok = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if name.components().count() > 1 || name.is_absolute() {
        return ok(name).then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| ok(p))
}
