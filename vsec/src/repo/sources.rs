//! apt source definitions: `sources.list` one-line entries and deb822 `.sources` files.

use crate::index::deb822::parse_stanzas;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct SourcesError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

/// Which keys may sign a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedBy {
    /// apt's default: the keyrings given by the caller (Debian's in `/usr/share/keyrings`).
    Default,
    Keyrings(Vec<PathBuf>),
    /// An armored key block written inline in a `.sources` file.
    Inline(String),
}

/// One repository: a base URI and one suite with its components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    pub uri: String,
    pub suite: String,
    pub components: Vec<String>,
    pub signed_by: SignedBy,
    /// `file:line` the entry came from, for messages.
    pub origin: String,
}

impl SourceEntry {
    /// Applies the first matching `(from, to)` prefix rewrite (a policy's mirror rewrite).
    pub fn rewrite(&mut self, rewrites: &[(String, String)]) {
        for (from, to) in rewrites {
            // Whole path segments only: `…/debian` must not rewrite `…/debian-security`.
            let from = from.trim_end_matches('/');
            if let Some(rest) = self.uri.strip_prefix(from)
                && (rest.is_empty() || rest.starts_with('/'))
            {
                self.uri = format!("{}{rest}", to.trim_end_matches('/'));
                return;
            }
        }
    }
}

/// Reads `/etc/apt/sources.list` and `/etc/apt/sources.list.d/*.{list,sources}` under `root`
/// (normally `/`), in apt's order: the main file, then the directory sorted by name.
pub fn host_sources(root: &Path) -> Result<Vec<SourceEntry>, SourcesError> {
    let mut out = Vec::new();
    let main = root.join("etc/apt/sources.list");
    if let Ok(t) = std::fs::read_to_string(&main) {
        out.extend(parse_one_line(&main, &t)?);
    }
    let dir = root.join("etc/apt/sources.list.d");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        let name = f.to_string_lossy();
        let Ok(t) = std::fs::read_to_string(&f) else {
            continue;
        };
        if name.ends_with(".list") {
            out.extend(parse_one_line(&f, &t)?);
        } else if name.ends_with(".sources") {
            out.extend(parse_deb822_sources(&f, &t)?);
        }
    }
    Ok(out)
}

/// One-line format: `deb [opt=v …] URI suite [component …]`. `deb-src` lines are skipped.
pub fn parse_one_line(file: &Path, text: &str) -> Result<Vec<SourceEntry>, SourcesError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |message: String| SourcesError {
            file: file.to_path_buf(),
            line: i + 1,
            message,
        };
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (kind, mut rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        rest = rest.trim_start();
        if kind == "deb-src" {
            continue;
        }
        if kind != "deb" {
            return Err(err(format!("expected `deb` or `deb-src`, found `{kind}`")));
        }
        let mut signed_by = SignedBy::Default;
        if let Some(opts) = rest.strip_prefix('[') {
            let (o, after) = opts
                .split_once(']')
                .ok_or_else(|| err("unterminated `[options]`".into()))?;
            for kv in o.split_whitespace() {
                if let Some(v) = kv.strip_prefix("signed-by=") {
                    signed_by = SignedBy::Keyrings(v.split(',').map(PathBuf::from).collect());
                }
            }
            rest = after.trim_start();
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() < 2 {
            return Err(err("expected `deb URI suite [component …]`".into()));
        }
        out.push(SourceEntry {
            uri: words[0].trim_end_matches('/').to_string(),
            suite: words[1].to_string(),
            components: words[2..].iter().map(|s| s.to_string()).collect(),
            signed_by,
            origin: format!("{}:{}", file.display(), i + 1),
        });
    }
    Ok(out)
}

/// deb822 format (`Types:`, `URIs:`, `Suites:`, `Components:`, `Signed-By:`, `Enabled:`).
pub fn parse_deb822_sources(file: &Path, text: &str) -> Result<Vec<SourceEntry>, SourcesError> {
    let stanzas = parse_stanzas(file, text).map_err(|e| SourcesError {
        file: file.to_path_buf(),
        line: e.line,
        message: e.message,
    })?;
    let mut out = Vec::new();
    for s in stanzas {
        let err = |field: &str, message: &str| SourcesError {
            file: file.to_path_buf(),
            line: s.line_of(field),
            message: message.to_string(),
        };
        if s.get("Enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("no"))
        {
            continue;
        }
        let types = s
            .get("Types")
            .ok_or_else(|| err("Types", "missing `Types:`"))?;
        if !types.split_whitespace().any(|t| t == "deb") {
            continue;
        }
        let uris = s
            .get("URIs")
            .ok_or_else(|| err("URIs", "missing `URIs:`"))?;
        let suites = s
            .get("Suites")
            .ok_or_else(|| err("Suites", "missing `Suites:`"))?;
        let components: Vec<String> = s
            .get("Components")
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let signed_by = match s.get("Signed-By") {
            None => SignedBy::Default,
            Some(v) if v.contains("BEGIN PGP") => SignedBy::Inline(
                // Inline blocks mark empty lines with ` .`.
                v.lines()
                    .map(|l| if l.trim() == "." { "" } else { l.trim() })
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            Some(v) => SignedBy::Keyrings(v.split_whitespace().map(PathBuf::from).collect()),
        };
        for uri in uris.split_whitespace() {
            for suite in suites.split_whitespace() {
                out.push(SourceEntry {
                    uri: uri.trim_end_matches('/').to_string(),
                    suite: suite.to_string(),
                    components: components.clone(),
                    signed_by: signed_by.clone(),
                    origin: format!("{}:{}", file.display(), s.line),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_formats() {
        let one = "# c\ndeb [arch=amd64 signed-by=/k.gpg] http://m/debian/ bookworm main contrib\ndeb-src http://m/debian bookworm main\n";
        let e = parse_one_line(Path::new("s.list"), one).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].uri, "http://m/debian");
        assert_eq!(e[0].components, ["main", "contrib"]);
        assert_eq!(e[0].signed_by, SignedBy::Keyrings(vec!["/k.gpg".into()]));
        let d = "Types: deb\nURIs: http://m/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://x\nSuites: s\nEnabled: no\n";
        let e = parse_deb822_sources(Path::new("d.sources"), d).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].suite, "bookworm-updates");
        assert_eq!(e[0].origin, "d.sources:1");
        let bad = parse_one_line(Path::new("s.list"), "\ndeb http://m\n").unwrap_err();
        assert_eq!(bad.line, 2);
        let mut r = e[0].clone();
        r.rewrite(&[("http://m/".into(), "file:///srv/mirror/".into())]);
        assert_eq!(r.uri, "file:///srv/mirror/debian");
        let mut sec = e[0].clone();
        sec.uri = "http://m/debian-security".into();
        sec.rewrite(&[("http://m/debian".into(), "http://site/debian".into())]);
        assert_eq!(sec.uri, "http://m/debian-security", "whole segments only");
    }
}
