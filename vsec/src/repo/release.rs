//! The `Release` file: dates, and the SHA256 and size of every index it covers.

use crate::index::deb822::{Deb822Error, parse_stanzas};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A Release file that cannot be used; every variant names the file (and line).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Syntax(#[from] Deb822Error),
    #[error("{}: empty Release file", file.display())]
    Empty { file: PathBuf },
    #[error("{}: Release file has no Date field", file.display())]
    NoDate { file: PathBuf },
    #[error("{}:{line}: {field} `{value}` is not an RFC 2822 date", file.display())]
    BadDate {
        file: PathBuf,
        line: usize,
        field: &'static str,
        value: String,
    },
    #[error("{}:{line}: expected `<sha256> <size> <path>` in the SHA256 list", file.display())]
    BadSum { file: PathBuf, line: usize },
    #[error("{}: Release file lists no SHA256 sums: cannot verify any index", file.display())]
    NoSums { file: PathBuf },
}

/// One `SHA256:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, Clone)]
pub struct Release {
    pub date_raw: String,
    pub date: DateTime<Utc>,
    pub valid_until: Option<DateTime<Utc>>,
    pub valid_until_raw: Option<String>,
    pub acquire_by_hash: bool,
    pub suite: Option<String>,
    pub codename: Option<String>,
    /// apt ≥ 2.7's `Snapshots:` URL template (`…/@SNAPSHOTID@/`), when the archive offers one.
    pub snapshots: Option<String>,
    /// Path relative to `dists/<suite>/` → hash and size.
    pub sha256: BTreeMap<String, IndexEntry>,
}

/// Parses an RFC 2822 date as written in Release files (`Sat, 11 Jul 2026 10:16:37 UTC`).
pub fn parse_date(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    let fixed = s
        .strip_suffix(" UTC")
        .map(|p| format!("{p} +0000"))
        .unwrap_or_else(|| s.to_string());
    DateTime::parse_from_rfc2822(&fixed)
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

impl Release {
    /// `file` labels errors only.
    pub fn parse(file: &Path, text: &str) -> Result<Release, ReleaseError> {
        let stanzas = parse_stanzas(file, text)?;
        let file_buf = || file.to_path_buf();
        let s = stanzas
            .first()
            .ok_or_else(|| ReleaseError::Empty { file: file_buf() })?;
        let date_raw = s
            .get("Date")
            .ok_or_else(|| ReleaseError::NoDate { file: file_buf() })?;
        let bad_date = |field: &'static str, value: &str| ReleaseError::BadDate {
            file: file_buf(),
            line: s.line_of(field),
            field,
            value: value.to_string(),
        };
        let date = parse_date(date_raw).ok_or_else(|| bad_date("Date", date_raw))?;
        let valid_until_raw = s.get("Valid-Until").map(str::to_string);
        let valid_until = match &valid_until_raw {
            None => None,
            Some(v) => Some(parse_date(v).ok_or_else(|| bad_date("Valid-Until", v))?),
        };
        let mut sha256 = BTreeMap::new();
        let line0 = s.line_of("SHA256");
        for (i, l) in s.get("SHA256").unwrap_or("").lines().enumerate() {
            let parts: Vec<&str> = l.split_whitespace().collect();
            if parts.is_empty() {
                continue;
            }
            let ok = parts.len() == 3
                && parts[0].len() == 64
                && parts[0].bytes().all(|b| b.is_ascii_hexdigit());
            let size = parts.get(1).and_then(|p| p.parse::<u64>().ok());
            match (ok, size) {
                (true, Some(size)) => {
                    sha256.insert(
                        parts[2].to_string(),
                        IndexEntry {
                            sha256: parts[0].to_ascii_lowercase(),
                            size,
                        },
                    );
                }
                _ => {
                    return Err(ReleaseError::BadSum {
                        file: file_buf(),
                        line: line0 + i + 1,
                    });
                }
            }
        }
        if sha256.is_empty() {
            return Err(ReleaseError::NoSums { file: file_buf() });
        }
        Ok(Release {
            date_raw: date_raw.to_string(),
            date,
            valid_until,
            valid_until_raw,
            acquire_by_hash: s.get("Acquire-By-Hash") == Some("yes"),
            suite: s.get("Suite").map(str::to_string),
            codename: s.get("Codename").map(str::to_string),
            snapshots: s.get("Snapshots").map(str::to_string),
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dates_and_sums() {
        let t = "Origin: Debian\nDate: Tue, 24 Nov 2026 00:34:33 UTC\nValid-Until: Tue, 01 Dec 2026 00:34:33 UTC\nAcquire-By-Hash: yes\nSHA256:\n 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages\n";
        let r = Release::parse(Path::new("R"), t).unwrap();
        assert!(r.acquire_by_hash);
        assert!(r.valid_until.unwrap() > r.date);
        assert_eq!(r.sha256["main/binary-amd64/Packages"].size, 50060337);
        let bad = t.replace("50060337", "big");
        assert!(
            Release::parse(Path::new("R"), &bad)
                .unwrap_err()
                .to_string()
                .contains("R:6")
        );
    }
}
