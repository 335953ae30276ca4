//! Shared by the root package's integration tests (`mod support;`): the skip-or-fail rule for
//! missing components and the `vse` binary under test.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// True when the component is there. Otherwise prints "skipped: …" and returns false, or
/// fails the test under `VSE_REQUIRE_ALL=1` (CI), where nothing may be skipped.
pub fn require(what: &str, ok: bool) -> bool {
    if ok {
        return true;
    }
    if std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("required component missing: {what}");
    }
    eprintln!("skipped: {what}");
    false
}

/// The `vse` binary built for this test run.
pub fn vse() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vse"))
}

/// The repository's example specs and policies.
pub fn specs() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs")
}

/// The host's bookworm lists are there (`apt-get update`) and apt can be run as the oracle.
pub fn host_lists() -> bool {
    let ok = std::fs::read_dir("/var/lib/apt/lists").is_ok_and(|d| {
        d.flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with("bookworm_InRelease")
        })
    });
    require("bookworm lists in /var/lib/apt/lists (apt-get update)", ok)
        && require("apt-get", Path::new("/usr/bin/apt-get").exists())
}
pub mod browser;
pub mod status_page;
pub mod vm;
