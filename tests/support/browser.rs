//! Headless Chromium for the page tests: the DOM after the page's scripts ran, and
//! screenshots. Each run gets a fresh profile and no background traffic.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Debian's `chromium` is installed (or the test is skipped / fails under VSE_REQUIRE_ALL).
pub fn chromium() -> bool {
    testkit::tool("chromium")
}

fn run(what: &[String], url: &str) -> Output {
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new("chromium")
        .args([
            "--headless=new",
            // Root (as the tests run) needs it; the page is our own, served on loopback.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "chromium {what:?} {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// The rendered DOM of `url` (serialised after the load event, scripts included).
pub fn dump_dom(url: &str) -> String {
    String::from_utf8_lossy(&run(&["--dump-dom".into()], url).stdout).into_owned()
}

/// A PNG of `url` at `width` x `height`.
pub fn screenshot(url: &str, out: &Path, width: u32, height: u32) {
    run(
        &[
            format!("--screenshot={}", out.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".into(),
        ],
        url,
    );
    let png = std::fs::read(out).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is no PNG",
        out.display()
    );
}
