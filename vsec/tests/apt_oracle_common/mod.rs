//! Shared by the apt-oracle tests: the host's apt lists as a source, apt itself as the judge.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use vsec::deb::Arch;
use vsec::index::Package;
use vsec::lock::LockedPackage;
use vsec::repo::{Location, ValidityCheck};
use vsec::resolve::{RepoConfig, load_universe};
use vsec::solve::{Provider, Universe};

/// apt's lists directory, from apt's configuration (checked by [`host_ready`]).
pub fn lists() -> PathBuf {
    testkit::apt::lists_dir().expect("host_ready() checked apt's configuration")
}

/// apt and the host's bookworm lists are there (or the test is skipped / fails under
/// `VSE_REQUIRE_ALL=1`).
pub fn host_ready() -> bool {
    testkit::apt::require_suite("bookworm")
}

/// The host's configured mirrors, read from apt's lists directory, verified with Debian's
/// keyring. Valid-Until is not enforced here: apt accepted these files when it downloaded
/// them, and the lists may be older than a week in CI; expiry has its own tests.
pub fn host_config() -> RepoConfig {
    let mut c = RepoConfig::host(Arch::new("amd64").unwrap()).expect("host apt sources parse");
    c.location = Location::AptLists(lists());
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
