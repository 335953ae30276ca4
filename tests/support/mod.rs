//! Shared by the root package's integration tests (`mod support;`): the `vse` binary under
//! test, the example specs, and the host's lists. Skip-or-fail, fixtures and process checks
//! come from `testkit`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `vse` binary built for this test run (Cargo names it to the root package's tests only).
pub fn vse() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vse"))
}

/// The repository's example specs and policies.
pub fn specs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs")
}

/// The host's bookworm lists are there (`apt-get update`) and apt can be run as the oracle
/// (or the test is skipped / fails under `VSE_REQUIRE_ALL=1`).
pub fn host_lists() -> bool {
    testkit::apt::require_suite("bookworm")
}
pub mod browser;
pub mod oci;
pub mod signing;
pub mod status_page;
pub mod vm;

/// `[rank R] N` lines, in order, per rank.
pub fn counts(out: &str) -> [Vec<u32>; 2] {
    let mut by = [Vec::new(), Vec::new()];
    for l in out.lines() {
        if let Some((r, n)) = l.strip_prefix("[rank ").and_then(|l| l.split_once("] "))
            && let (Ok(r), Ok(n)) = (r.parse::<usize>(), n.trim().parse::<u32>())
        {
            by[r].push(n);
        }
    }
    by
}

/// Follows a child's stdout: every line as it comes, the whole output so far each time (on
/// the receiver); the thread returns all of it at the end.
pub fn follow(
    stdout: std::process::ChildStdout,
) -> (
    std::sync::mpsc::Receiver<String>,
    std::thread::JoinHandle<String>,
) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for l in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            all.push_str(&l);
            all.push('\n');
            let _ = tx.send(all.clone());
        }
        all
    });
    (rx, reader)
}
