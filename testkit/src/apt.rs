//! The host's apt lists, found the way apt finds them: `Dir::State::lists` from apt's own
//! configuration (`apt-config`), never a mirror's host name. A list file's name is its URI
//! with `/` turned into `_`, so a suite is found by the `_dists_<suite>_…` part of the name.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// apt's lists directory (`apt-config shell LISTS Dir::State::lists/d`), or `None` when apt
/// is not installed.
pub fn lists_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| query(None)).clone()
}

/// Asks `apt-config` (with `APT_CONFIG=config` when given) for the lists directory.
fn query(config: Option<&Path>) -> Option<PathBuf> {
    let mut cmd = std::process::Command::new("apt-config");
    cmd.args(["shell", "LISTS", "Dir::State::lists/d"]);
    if let Some(c) = config {
        cmd.env("APT_CONFIG", c);
    }
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix("LISTS='")?.strip_suffix('\''))?;
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

/// The list file whose name ends in `_dists_<rest>`, e.g. `bookworm_InRelease` or
/// `bookworm-updates_main_binary-amd64_Packages.lz4` (the first by name if several mirrors
/// carry it).
pub fn list_file(rest: &str) -> Option<PathBuf> {
    let suffix = format!("_dists_{rest}");
    std::fs::read_dir(lists_dir()?)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(&suffix))
        })
        .min()
}

/// The `InRelease` of `suite` in apt's lists.
pub fn in_release(suite: &str) -> Option<PathBuf> {
    list_file(&format!("{suite}_InRelease"))
}

/// apt and the lists of `suite` are there, or they are reported missing.
#[track_caller]
pub fn require_suite(suite: &str) -> bool {
    let Some(dir) = lists_dir() else {
        crate::missing(
            "apt's configuration (`apt-config` on PATH)",
            "apt-get install apt",
        );
        return false;
    };
    crate::require(
        in_release(suite).is_some(),
        &format!("the {suite} InRelease in apt's lists {}", dir.display()),
        &format!("add a {suite} source and run `apt-get update`"),
    ) && crate::tool("apt-get")
}

/// The list file `_dists_<rest>` (as [`list_file`]), or `None` after reporting it missing.
#[track_caller]
pub fn require_list_file(rest: &str) -> Option<PathBuf> {
    let f = list_file(rest);
    crate::require(
        f.is_some(),
        &format!(
            "a list file ending in _dists_{rest} in apt's lists {}",
            lists_dir().unwrap_or_default().display()
        ),
        "add that suite to apt's sources and run `apt-get update`",
    );
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_come_from_apts_configuration() {
        if !crate::tool("apt-config") {
            return;
        }
        let dir = lists_dir().expect("apt-config names the lists directory");
        assert!(dir.is_absolute(), "{}", dir.display());
        // A configuration that moves the lists moves them here too.
        let conf = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            conf.path(),
            "Dir::State::lists \"/srv/elsewhere/lists/\";\n",
        )
        .unwrap();
        assert_eq!(
            query(Some(conf.path())),
            Some(PathBuf::from("/srv/elsewhere/lists/"))
        );
    }
}
