//! The policy's `files.protected` and `packages.forbidden`, checked again on the root after
//! every post-install command: the spec is checked before the build, but a command can write
//! anything inside the image or install a package from a `.deb`. Protected paths are
//! snapshotted before the first command (kind, mode, owner, link target, content digest)
//! and compared after each; a forbidden package counts as present when dpkg's status has an
//! entry for it that is not `not-installed`, or its file list is in dpkg's info directory.
//! Every read goes through [`InRoot`], so nothing the commands planted leads out of the root.

use crate::rootfs::inroot::{InRoot, Kind};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io;
use vsec::deb::{DebVersion, PackageName, PackagePattern};

/// One policy rule, with where it was written (for messages).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    /// An absolute image path (protected), or a package pattern (forbidden).
    pub value: String,
    /// `file:line:column` of the policy line.
    pub origin: String,
}

/// The rules to hold after post-install commands.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Guard {
    pub protected: Vec<Rule>,
    pub forbidden: Vec<Rule>,
}

#[derive(Debug, thiserror::Error)]
pub enum Violation {
    #[error("{change} {path}, which is protected by the policy (files.protected: {} at {})", rule.value, rule.origin)]
    Protected {
        path: String,
        change: &'static str,
        rule: Rule,
    },
    #[error("installed package `{package}` {version} ({evidence}), which the policy forbids (packages.forbidden: `{}` at {})", rule.value, rule.origin)]
    Forbidden {
        package: String,
        version: String,
        evidence: String,
        rule: Rule,
    },
    #[error("packages.forbidden: `{}` at {}: not a package pattern: {reason}", rule.value, rule.origin)]
    BadPattern { rule: Rule, reason: String },
    #[error("reading {path} in the image to check the policy: {source}")]
    Io { path: String, source: io::Error },
}

/// What one path was like (a changed `ctime` or inode alone is not a change).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: Kind,
    perm: u32,
    uid: u32,
    gid: u32,
    /// File content digest, or symlink target.
    content: Vec<u8>,
}

/// The protected paths before the first command, by image path (absent paths are absent).
#[derive(Debug, Clone, Default)]
pub struct Snapshot(BTreeMap<String, (Entry, usize)>);

fn io_err(path: &str) -> impl FnOnce(io::Error) -> Violation + '_ {
    move |source| Violation::Io {
        path: path.to_string(),
        source,
    }
}

impl Guard {
    pub fn is_empty(&self) -> bool {
        self.protected.is_empty() && self.forbidden.is_empty()
    }

    /// Every path under the protected rules as it is now.
    pub fn snapshot(&self, root: &InRoot) -> Result<Snapshot, Violation> {
        let mut out = BTreeMap::new();
        for (i, rule) in self.protected.iter().enumerate() {
            walk(root, &rule.value, i, &mut out)?;
        }
        Ok(Snapshot(out))
    }

    /// The first rule the root breaks now, against `before`.
    pub fn check(&self, root: &InRoot, before: &Snapshot) -> Result<(), Violation> {
        let now = self.snapshot(root)?;
        let rule = |i: usize| self.protected[i].clone();
        for (path, (was, i)) in &before.0 {
            match now.0.get(path) {
                None => {
                    return Err(Violation::Protected {
                        path: path.clone(),
                        change: "removed",
                        rule: rule(*i),
                    });
                }
                Some((is, _)) if is != was => {
                    return Err(Violation::Protected {
                        path: path.clone(),
                        change: "changed",
                        rule: rule(*i),
                    });
                }
                Some(_) => {}
            }
        }
        if let Some((path, (_, i))) = now.0.iter().find(|(p, _)| !before.0.contains_key(*p)) {
            return Err(Violation::Protected {
                path: path.clone(),
                change: "added",
                rule: rule(*i),
            });
        }
        self.check_packages(root)
    }

    fn check_packages(&self, root: &InRoot) -> Result<(), Violation> {
        if self.forbidden.is_empty() {
            return Ok(());
        }
        let patterns = self
            .forbidden
            .iter()
            .map(|r| {
                PackagePattern::parse(&r.value)
                    .map(|p| (p, r))
                    .map_err(|e| Violation::BadPattern {
                        rule: r.clone(),
                        reason: e.reason,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let status_path = "var/lib/dpkg/status";
        let status = match root.read(status_path) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io_err(status_path)(e)),
        };
        let mut present: Vec<(String, Option<String>, String)> = status
            .split("\n\n")
            .filter_map(|stanza| {
                let field = |k: &str| {
                    stanza
                        .lines()
                        .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                        .map(|v| v.trim().to_string())
                };
                let state = field("Status")?;
                if state.ends_with("not-installed") {
                    return None;
                }
                let evidence = format!("dpkg status: {state}");
                Some((field("Package")?, field("Version"), evidence))
            })
            .collect();
        let info = "var/lib/dpkg/info";
        if root.is_dir(info) {
            for (name, _) in root.read_dir(info).map_err(io_err(info))? {
                let name = name.to_string_lossy();
                if let Some(stem) = name.strip_suffix(".list") {
                    let pkg = stem.split(':').next().unwrap_or(stem).to_string();
                    let version = present
                        .iter()
                        .find(|(p, _, _)| *p == pkg)
                        .and_then(|(_, v, _)| v.clone());
                    present.push((pkg, version, format!("file list /{info}/{name}")));
                }
            }
        }
        for (pkg, version, evidence) in present {
            let Ok(name) = PackageName::new(&pkg) else {
                continue;
            };
            let version = version.and_then(|v| DebVersion::parse(&v).ok());
            for (pattern, rule) in &patterns {
                let hit = match &version {
                    Some(v) => pattern.matches(&name, v),
                    None => pattern.constraint.is_none() && pattern.matches_name(&name),
                };
                if hit {
                    return Err(Violation::Forbidden {
                        package: pkg,
                        version: version.map(|v| v.to_string()).unwrap_or_default(),
                        evidence,
                        rule: (*rule).clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Records `path` and, for a directory, everything under it (symlinks are not followed).
fn walk(
    root: &InRoot,
    path: &str,
    rule: usize,
    out: &mut BTreeMap<String, (Entry, usize)>,
) -> Result<(), Violation> {
    let rel = path.trim_start_matches('/');
    let st = if rel.is_empty() {
        root.stat("")
    } else {
        root.lstat(rel)
    };
    let st = match st {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        // A component that is not a directory: the path does not exist.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let content = match st.kind {
        Kind::File => Sha256::digest(root.read(rel).map_err(io_err(path))?).to_vec(),
        Kind::Symlink => root
            .read_link(rel)
            .map_err(io_err(path))?
            .into_os_string()
            .into_encoded_bytes(),
        _ => Vec::new(),
    };
    let entry = Entry {
        kind: st.kind,
        perm: st.perm,
        uid: st.uid,
        gid: st.gid,
        content,
    };
    let key = format!("/{rel}");
    if out.contains_key(&key) {
        return Ok(()); // nested protected paths: the first rule names it
    }
    out.insert(key.clone(), (entry, rule));
    if st.kind == Kind::Dir {
        for (name, _) in root.read_dir(rel).map_err(io_err(path))? {
            let child = if rel.is_empty() {
                name.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", name.to_string_lossy())
            };
            walk(root, &child, rule, out)?;
        }
    }
    Ok(())
}
