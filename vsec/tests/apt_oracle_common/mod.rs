//! Shared by the apt-oracle tests: the host's apt lists as a source, apt itself as the judge.

#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;
use vsec::deb::Arch;
use vsec::index::Package;
use vsec::lock::LockedPackage;
use vsec::repo::ValidityCheck;
use vsec::resolve::{RepoConfig, load_universe};
use vsec::solve::{Provider, Universe};

pub const LISTS: &str = "/var/lib/apt/lists";

/// Skips (prints why, returns false) or fails under `VSE_REQUIRE_ALL=1`.
pub fn require(ok: bool, why: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("VSE_REQUIRE_ALL=1 but {why}");
    }
    eprintln!("skipped: {why}");
    false
}

pub fn host_ready() -> bool {
    let lists = std::fs::read_dir(LISTS)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with("_InRelease"))
        })
        .unwrap_or(false);
    require(
        lists,
        "no InRelease files in /var/lib/apt/lists (run `apt-get update`)",
    ) && require(
        Path::new("/usr/bin/apt-get").exists(),
        "apt-get is not installed",
    )
}

/// The host's configured mirrors, read from apt's lists directory, verified with Debian's
/// keyring. Valid-Until is not enforced here: apt accepted these files when it downloaded
/// them, and the lists may be older than a week in CI; expiry has its own tests.
pub fn host_config() -> RepoConfig {
    let mut c = RepoConfig::host(Arch::new("amd64").unwrap()).expect("host apt sources parse");
    c.validity = ValidityCheck::Ignore;
    c
}

pub fn universe() -> &'static Universe {
    static U: OnceLock<Universe> = OnceLock::new();
    U.get_or_init(|| load_universe(&host_config()).expect("host lists load").0)
}

/// Finds the index entry a locked package came from.
pub fn package_of<'a>(u: &'a Universe, p: &LockedPackage) -> &'a Package {
    u.by_name(p.name.as_str())
        .iter()
        .map(|&id| u.package(id))
        .find(|q| q.version == p.version && q.architecture == p.architecture)
        .expect("locked package is in the universe")
}
