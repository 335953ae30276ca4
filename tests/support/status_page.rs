//! `vse status --serve` for the page tests: the real binary on an ephemeral loopback port,
//! and a look at the rendered DOM.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

/// `vse status --serve …` on the database `db`; `url` is what it printed. Killed on drop.
pub struct StatusServer {
    child: Child,
    pub url: String,
}

impl StatusServer {
    /// `args` go after `--db DB`, e.g. `["--serve", "127.0.0.1:0"]`.
    pub fn start(db: &Path, args: &[&str]) -> Self {
        let mut child = super::vse()
            .args(["status", "--db"])
            .arg(db)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let url = served_url(&mut child);
        StatusServer { child, url }
    }
}

/// The page's URL, from the first line a `vse status --serve` child (stdout piped) prints.
pub fn served_url(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string()
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The attribute `name` of the first element whose start tag contains `marker`.
pub fn attr(dom: &str, marker: &str, name: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let start = dom[..at].rfind('<')?;
    let tag = &dom[start..at + dom[at..].find('>')?];
    let v = tag.split(&format!("{name}=\"")).nth(1)?;
    Some(v[..v.find('"')?].to_string())
}
