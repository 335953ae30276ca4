//! The written forms of shares: a spec's string item or a `--share` argument
//! (`HOST[:GUEST][:ro|:rw]`), a guest path, a policy's `shares.default` entry.

use crate::env::{DefaultDir, DefaultShare};
use crate::units::{AbsPath, ValueError};
use std::path::{Component, Path, PathBuf};

/// Top-level guest directories no share may cover: the guest's own system, which a share
/// would hide, and read-write would let host files stand in for the guest's programs.
const RESERVED: &[&str] = &[
    "proc", "sys", "dev", "run", "etc", "usr", "bin", "sbin", "boot",
];

const GUEST_HINT: &str = "pick a guest path of its own, such as /data";

/// A share's path in the guest: absolute, normalized, outside the guest's system.
pub fn guest_path(s: &str) -> Result<AbsPath, ValueError> {
    let p = AbsPath::parse(s).map_err(|e| {
        ValueError::new(format!("guest path: {}", e.message)).hint(
            "write a normalized absolute guest path (no `.`, `..`, `//` or trailing `/`), such as /data",
        )
    })?;
    let top = p.components().next().map(str::to_string);
    match top.as_deref() {
        None => Err(ValueError::new(
            "guest path `/`: a share cannot hide the guest's whole system",
        )
        .hint(GUEST_HINT)),
        Some(top) if RESERVED.contains(&top) || top.starts_with("lib") => Err(ValueError::new(
            format!("guest path `{s}` is under /{top}, which the guest's system needs"),
        )
        .hint(GUEST_HINT)),
        Some(_) => Ok(p),
    }
}

/// `ro` or `rw`, as `true` for read-only.
pub fn mode(s: &str) -> Result<bool, ValueError> {
    match s {
        "ro" => Ok(true),
        "rw" => Ok(false),
        _ => Err(ValueError::new(format!("unknown mode `{s}`"))
            .hint("expected `ro` (read-only) or `rw` (read-write)")),
    }
}

/// A host path as written: `~`, `~/x`, a relative or an absolute path. Only the calling
/// user's `~` is expanded: another user's home is theirs to share.
pub fn host_path(s: &str) -> Result<String, ValueError> {
    if s.is_empty() {
        return Err(ValueError::new("empty host path")
            .hint("name a host directory, e.g. `~/results` or `.`"));
    }
    if s.contains('\0') {
        return Err(ValueError::new("host path contains a NUL byte"));
    }
    if s.starts_with('~') && s != "~" && !s.starts_with("~/") {
        return Err(
            ValueError::new(format!("`{s}`: only `~` (your home) is expanded"))
                .hint("write another user's directory as an absolute path"),
        );
    }
    Ok(s.to_string())
}

/// The string form, split and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub host: String,
    pub guest: Option<AbsPath>,
    pub ro: bool,
}

/// `HOST[:GUEST][:ro|:rw]`.
pub fn written(s: &str) -> Result<Written, ValueError> {
    let mut parts: Vec<&str> = s.split(':').collect();
    let mut ro = false;
    if parts.len() > 1
        && let Some(Ok(m)) = parts.last().map(|m| mode(m))
    {
        ro = m;
        parts.pop();
    }
    let (host, guest) = match parts[..] {
        [host] => (host, None),
        [host, guest] => (host, Some(guest)),
        [_, _, m] if !m.contains('/') => return Err(mode(m).expect_err("not a mode above")),
        _ => {
            return Err(ValueError::new(format!("`{s}` has too many `:`")).hint(
                "write HOST[:GUEST][:ro|:rw]; a path holding `:` is shared with a spec's map form {host: ..., guest: ...}",
            ));
        }
    };
    let guest = match guest {
        Some("") => {
            return Err(ValueError::new(format!("`{s}`: empty guest path"))
                .hint("write HOST:GUEST, or HOST alone to use the host path in the guest"));
        }
        Some(g) => Some(guest_path(g)?),
        None => None,
    };
    Ok(Written {
        host: host_path(host)?,
        guest,
        ro,
    })
}

/// A `shares.default` entry: `cwd`, `home` or an absolute path (shared at the same path in
/// the guest), each optionally ending in `:ro` or `:rw`.
pub fn default_entry(s: &str) -> Result<DefaultShare, ValueError> {
    let (what, ro) = match s.rsplit_once(':') {
        Some((w, m)) => (w, mode(m)?),
        None => (s, false),
    };
    let dir = match what {
        "cwd" => DefaultDir::Cwd,
        "home" => DefaultDir::Home,
        p if p.starts_with('/') => DefaultDir::Path(guest_path(p)?),
        _ => {
            return Err(ValueError::new(format!("`{s}` is not a default share"))
                .hint("write `cwd` (the launch directory), `home` (the user's home) or an absolute path, optionally ending in :ro"));
        }
    };
    Ok(DefaultShare { dir, ro })
}

/// `p` with `.` and `..` taken away by their names only: for comparing written paths and
/// naming guest paths, never for deciding what a host path is (symlinks).
pub fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}
