//! Path safety for untrusted archives.
//!
//! Every archive path is turned into a [`RelPath`] (normal components only: no `..`, no
//! absolute path) and then resolved against the rootfs the way the kernel's `RESOLVE_IN_ROOT`
//! does: a symlink met on the way is followed *inside* the rootfs (absolute targets start at
//! the rootfs, `..` stops at it). So no entry, symlink or hard link can make anything land
//! outside the rootfs, whatever the archive contains.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed while resolving one path, as in the kernel's ELOOP limit.
const MAX_SYMLINK_HOPS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error(
        "archive path {path:?} is absolute; expected a path relative to the rootfs (./usr/...)"
    )]
    Absolute { path: String },
    #[error("archive path {path:?} contains `..`; refusing to write outside the rootfs")]
    DotDot { path: String },
    #[error("archive path {path:?} is not valid UTF-8 or contains NUL")]
    Encoding { path: String },
    #[error("resolving {path:?} inside the rootfs followed more than {MAX_SYMLINK_HOPS} symlinks")]
    SymlinkLoop { path: String },
    #[error("{path:?}: component {component:?} exists and is not a directory")]
    NotADirectory { path: String, component: String },
    #[error("I/O error at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A path relative to the rootfs made of normal components only (may be empty = the root).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

impl RelPath {
    /// Validates an archive member name such as `./usr/bin/x` or `usr/bin/x/`.
    pub fn parse(raw: &[u8]) -> Result<Self, PathError> {
        let shown = String::from_utf8_lossy(raw).into_owned();
        let s = std::str::from_utf8(raw)
            .ok()
            .filter(|s| !s.contains('\0'))
            .ok_or_else(|| PathError::Encoding {
                path: shown.clone(),
            })?;
        if s.starts_with('/') {
            return Err(PathError::Absolute { path: shown });
        }
        let mut parts = Vec::new();
        for comp in Path::new(s).components() {
            match comp {
                Component::Normal(c) => parts.push(c.to_str().unwrap_or_default()),
                Component::CurDir => {}
                Component::ParentDir => return Err(PathError::DotDot { path: shown }),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(PathError::Absolute { path: shown });
                }
            }
        }
        Ok(RelPath(parts.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// `/usr/bin/x`: the absolute path inside the image.
    pub fn image_path(&self) -> String {
        format!("/{}", self.0)
    }

    pub fn components(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// Splits into (parent, file name); `None` for the root.
    pub fn split_last(&self) -> Option<(RelPath, &str)> {
        if self.is_root() {
            return None;
        }
        match self.0.rsplit_once('/') {
            Some((p, n)) => Some((RelPath(p.to_string()), n)),
            None => Some((RelPath(String::new()), &self.0)),
        }
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.0)
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PathError + '_ {
    move |source| PathError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Resolves `rel` as a directory inside `root`, following symlinks within the root and
/// creating missing directories (mode 0755) when `create` is set. Returns the host path
/// and the rootfs-relative components of the resolved directory.
pub fn resolve_dir(root: &Path, rel: &RelPath, create: bool) -> Result<PathBuf, PathError> {
    resolve_dir_traced(root, rel, create).map(|r| r.host)
}

/// A directory resolved inside the rootfs, and how: the symlinks followed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub host: PathBuf,
    /// Image paths of the symlinks that were followed, in order.
    pub symlinks: Vec<String>,
    /// A symlink's `..` tried to climb above the rootfs and was stopped at it: the path only
    /// stays inside because of the confinement (an archive made with care never does this).
    pub clamped: bool,
}

/// [`resolve_dir`], also saying which symlinks were followed, so that callers with stricter
/// rules (image layers) can refuse what the confinement would silently redirect.
pub fn resolve_dir_traced(root: &Path, rel: &RelPath, create: bool) -> Result<Resolved, PathError> {
    let mut hops = 0;
    let mut symlinks = Vec::new();
    let mut clamped = false;
    // Work list of components still to walk; symlink targets are pushed in front.
    let mut pending: Vec<String> = rel.components().rev().map(str::to_string).collect();
    let mut cur: Vec<String> = Vec::new();
    while let Some(comp) = pending.pop() {
        match comp.as_str() {
            "" | "." => continue,
            ".." => {
                // `..` never climbs above the rootfs
                clamped |= cur.pop().is_none();
                continue;
            }
            _ => {}
        }
        let host = join(root, &cur).join(&comp);
        match std::fs::symlink_metadata(&host) {
            Ok(md) if md.is_dir() => cur.push(comp),
            Ok(md) if md.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(PathError::SymlinkLoop {
                        path: rel.to_string(),
                    });
                }
                symlinks.push(format!("/{}", join_str(&cur, &comp)));
                let target = std::fs::read_link(&host).map_err(io_err(&host))?;
                let tb = target.as_os_str().as_bytes();
                if tb.starts_with(b"/") {
                    cur.clear();
                }
                for c in tb.split(|b| *b == b'/').rev() {
                    pending.push(String::from_utf8_lossy(c).into_owned());
                }
            }
            Ok(_) => {
                return Err(PathError::NotADirectory {
                    path: rel.to_string(),
                    component: comp,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                std::fs::create_dir(&host).map_err(io_err(&host))?;
                cur.push(comp);
            }
            Err(e) => return Err(io_err(&host)(e)),
        }
    }
    Ok(Resolved {
        host: join(root, &cur),
        symlinks,
        clamped,
    })
}

fn join_str(parts: &[String], last: &str) -> String {
    let mut s = parts.join("/");
    if !s.is_empty() {
        s.push('/');
    }
    s.push_str(last);
    s
}

/// Resolves `rel` fully (its last component too, if it is a symlink) inside `root`,
/// without creating anything. Used for hard-link targets.
pub fn resolve_existing(root: &Path, rel: &RelPath) -> Result<PathBuf, PathError> {
    let Some((parent, name)) = rel.split_last() else {
        return Ok(root.to_path_buf());
    };
    let dir = resolve_dir(root, &parent, false)?;
    let host = dir.join(name);
    let md = std::fs::symlink_metadata(&host).map_err(io_err(&host))?;
    if md.file_type().is_symlink() {
        // A directory-or-file target: resolve it as a directory chain then the last part.
        let target = std::fs::read_link(&host).map_err(io_err(&host))?;
        let base = if target.is_absolute() {
            String::new()
        } else {
            parent.as_str().to_string()
        };
        let joined = format!("{base}/{}", target.display());
        let (p, n) = joined.rsplit_once('/').unwrap_or(("", &joined));
        let dir = resolve_dir(root, &RelPath(p.trim_start_matches('/').into()), false)?;
        return Ok(dir.join(n));
    }
    Ok(host)
}

fn join(root: &Path, parts: &[String]) -> PathBuf {
    let mut p = root.to_path_buf();
    for c in parts {
        p.push(OsStr::new(c));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_escapes_and_normalises() {
        assert_eq!(
            RelPath::parse(b"./usr/bin/x").unwrap().as_str(),
            "usr/bin/x"
        );
        assert_eq!(RelPath::parse(b"usr/lib/").unwrap().as_str(), "usr/lib");
        assert!(RelPath::parse(b"./").unwrap().is_root());
        assert!(matches!(
            RelPath::parse(b"/etc/passwd"),
            Err(PathError::Absolute { .. })
        ));
        assert!(matches!(
            RelPath::parse(b"./a/../../x"),
            Err(PathError::DotDot { .. })
        ));
        assert!(matches!(
            RelPath::parse(b"a/\xff"),
            Err(PathError::Encoding { .. })
        ));
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.path().join("up")).unwrap();
        let d = resolve_dir(root.path(), &RelPath::parse(b"abs/x").unwrap(), true).unwrap();
        assert!(d.starts_with(root.path()), "{d:?}");
        let d = resolve_dir(root.path(), &RelPath::parse(b"up/y").unwrap(), true).unwrap();
        assert_eq!(d, root.path().join("y"));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn traced_resolution_names_the_symlinks_and_clamping() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", root.path().join("lib")).unwrap();
        std::os::unix::fs::symlink("../../..", root.path().join("usr/up")).unwrap();
        let r = resolve_dir_traced(root.path(), &RelPath::parse(b"lib/x").unwrap(), true).unwrap();
        assert_eq!(r.host, root.path().join("usr/lib/x"));
        assert_eq!(r.symlinks, vec!["/lib".to_string()]);
        assert!(!r.clamped);
        let r =
            resolve_dir_traced(root.path(), &RelPath::parse(b"usr/up/y").unwrap(), true).unwrap();
        assert_eq!(r.host, root.path().join("y"));
        assert!(r.clamped);
    }

    #[test]
    fn symlink_loops_are_bounded() {
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("b", root.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", root.path().join("b")).unwrap();
        let e = resolve_dir(root.path(), &RelPath::parse(b"a/x").unwrap(), true).unwrap_err();
        assert!(matches!(e, PathError::SymlinkLoop { .. }), "{e}");
    }
}
