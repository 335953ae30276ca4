//! Headless Chromium for the page tests: the DOM after the page's scripts ran, and
//! screenshots. Each run gets a fresh profile and no background traffic.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Debian's `chromium` is installed (or the test is skipped / fails under VSE_REQUIRE_ALL).
pub fn chromium() -> bool {
    testkit::tool("chromium")
}

/// Headless, quiet, and no sandbox: root (as the tests run) needs that, and the page is our
/// own, served on loopback.
const HEADLESS: [&str; 8] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
];

fn run(what: &[String], url: &str) -> Output {
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new("chromium")
        .args(HEADLESS)
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

/// A page held open in headless Chromium, driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: JSON messages ended by NUL, read on fd 3, written on fd 4), so
/// a test sees what the page's own scripts make of changes that happen while it is open.
/// The two FIFOs are handed to Chromium by the shell's redirections: no unsafe `dup2` here.
pub struct LivePage {
    child: std::process::Child,
    to: std::fs::File,
    from: std::sync::mpsc::Receiver<serde_json::Value>,
    session: String,
    next: u64,
    _dir: tempfile::TempDir,
}

impl LivePage {
    /// Opens `url`; `before_load` runs in the page before any of its own scripts.
    pub fn open(url: &str, before_load: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (to_chrome, from_chrome) = (dir.path().join("in"), dir.path().join("out"));
        for f in [&to_chrome, &from_chrome] {
            let st = Command::new("mkfifo").arg(f).status().unwrap();
            assert!(st.success(), "mkfifo {}", f.display());
        }
        let child = Command::new("bash")
            .arg("-c")
            .arg(r#"exec chromium "${@:3}" 3<"$1" 4>"$2""#)
            .args([
                "bash".as_ref(),
                to_chrome.as_os_str(),
                from_chrome.as_os_str(),
            ])
            .args(HEADLESS)
            .arg("--remote-debugging-pipe")
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("profile").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Each open waits for the shell's matching redirection, in the same order.
        let to = std::fs::OpenOptions::new()
            .write(true)
            .open(&to_chrome)
            .unwrap();
        let reader = std::fs::File::open(&from_chrome).unwrap();
        let (tx, from) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(reader);
            let mut buf = Vec::new();
            while std::io::BufRead::read_until(&mut r, 0, &mut buf).is_ok_and(|n| n > 0) {
                let msg = buf.strip_suffix(&[0]).unwrap_or(&buf);
                if let Ok(v) = serde_json::from_slice(msg)
                    && tx.send(v).is_err()
                {
                    return;
                }
                buf.clear();
            }
        });
        let mut page = LivePage {
            child,
            to,
            from,
            session: String::new(),
            next: 0,
            _dir: dir,
        };
        let target = page.call(
            "Target.createTarget",
            serde_json::json!({"url": "about:blank"}),
        );
        let attached = page.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target["targetId"], "flatten": true}),
        );
        page.session = attached["sessionId"].as_str().unwrap().to_string();
        if let Some(src) = before_load {
            page.call("Page.enable", serde_json::json!({}));
            page.call(
                "Page.addScriptToEvaluateOnNewDocument",
                serde_json::json!({ "source": src }),
            );
        }
        page.call("Page.navigate", serde_json::json!({ "url": url }));
        page
    }

    /// One DevTools command (in the page's session once there is one) and its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::Write;
        self.next += 1;
        let mut msg = serde_json::json!({"id": self.next, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let v = (self.from.recv_timeout(left))
                .unwrap_or_else(|e| panic!("chromium: no answer to {method}: {e}"));
            if v["id"] == self.next {
                assert!(v["error"].is_null(), "chromium: {method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page (JSON-serialisable).
    pub fn eval(&mut self, expr: &str) -> serde_json::Value {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Evaluates `expr` every 100 ms until `done` accepts its value; panics with the last
    /// value after `secs`.
    pub fn wait_until(
        &mut self,
        expr: &str,
        secs: u64,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let v = self.eval(expr);
            if done(&v) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after {secs} s the page still shows {v} for {expr}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for LivePage {
    fn drop(&mut self) {
        // Closing lets the browser take its renderers down with it; a kill is the fallback.
        use std::io::Write;
        let _ = (self.to).write_all(b"{\"id\":0,\"method\":\"Browser.close\"}\0");
        for _ in 0..50 {
            if self.child.try_wait().is_ok_and(|s| s.is_some()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
