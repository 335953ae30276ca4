//! Unpacks a data tarball into the rootfs. Ownership, setuid/setgid bits and device nodes
//! are *recorded* ([`Records`]) for the image writer and never applied to the host, so a
//! build needs no privilege and a hostile archive cannot plant a setuid file on the host.

use super::path::{PathError, RelPath, resolve_dir, resolve_existing};
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("{member}: {source}")]
    Path { member: String, source: PathError },
    #[error("{member}: cannot replace directory {path} with a non-directory")]
    DirConflict { member: String, path: String },
    #[error("{member}: hard link target {target} is not a regular file in the rootfs")]
    BadHardlink { member: String, target: String },
    #[error("{member}: unsupported tar entry type {kind:?}")]
    EntryType { member: String, kind: u8 },
    #[error("reading the data tarball: {0}")]
    Read(io::Error),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    CharDev { major: u32, minor: u32 },
    BlockDev { major: u32, minor: u32 },
    Fifo,
}

/// What the image must hold for one path, whatever the host file looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub kind: Kind,
    /// Permission bits including setuid/setgid/sticky (no file type bits).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Image metadata by absolute image path (`/usr/bin/passwd`); later packages win.
pub type Records = BTreeMap<String, Meta>;

/// Unpacks `tar` into `root`. Returns the image paths the package owns (for dpkg's `.list`).
pub fn extract_data(
    tar: &mut dyn Read,
    root: &Path,
    records: &mut Records,
) -> Result<Vec<String>, ExtractError> {
    let mut owned = Vec::new();
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(ExtractError::Read)? {
        let mut entry = entry.map_err(ExtractError::Read)?;
        let e = extract_entry(&mut entry, root, records)?;
        // The root's metadata is recorded, but dpkg does not list it as owned.
        if e.path != "/" {
            owned.push(e.path);
        }
    }
    Ok(owned)
}

/// Where one archive entry went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The archive's path as an image path (`/bin/su`).
    pub path: String,
    /// Where it really landed after following symlinks inside the rootfs (`/usr/bin/su`):
    /// the key of its [`Records`] entry.
    pub landed: String,
    pub kind: Kind,
}

/// Unpacks one tar entry into `root` and records its metadata (also used for image layers,
/// whose whiteouts the caller handles before calling this).
pub fn extract_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    root: &Path,
    records: &mut Records,
) -> Result<Extracted, ExtractError> {
    let raw = entry.path_bytes().into_owned();
    let member = String::from_utf8_lossy(&raw).into_owned();
    let perr = |source| ExtractError::Path {
        member: member.clone(),
        source,
    };
    let rel = RelPath::parse(&raw).map_err(perr)?;
    let h = entry.header();
    let perm = h.mode().map_err(ExtractError::Read)? & 0o7777;
    let uid = h.uid().map_err(ExtractError::Read)? as u32;
    let gid = h.gid().map_err(ExtractError::Read)? as u32;
    let ty = h.entry_type();
    let dev = || -> Result<(u32, u32), ExtractError> {
        Ok((
            h.device_major().map_err(ExtractError::Read)?.unwrap_or(0),
            h.device_minor().map_err(ExtractError::Read)?.unwrap_or(0),
        ))
    };
    let kind = match ty {
        tar::EntryType::Directory => Kind::Dir,
        tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
        tar::EntryType::Link => Kind::File,
        tar::EntryType::Symlink => Kind::Symlink,
        tar::EntryType::Char => {
            let (major, minor) = dev()?;
            Kind::CharDev { major, minor }
        }
        tar::EntryType::Block => {
            let (major, minor) = dev()?;
            Kind::BlockDev { major, minor }
        }
        tar::EntryType::Fifo => Kind::Fifo,
        other => {
            return Err(ExtractError::EntryType {
                member,
                kind: other.as_byte(),
            });
        }
    };
    let meta = Meta {
        kind,
        perm,
        uid,
        gid,
    };
    if rel.is_root() {
        records.insert("/".into(), meta);
        return Ok(Extracted {
            path: rel.image_path(),
            landed: "/".into(),
            kind,
        });
    }
    // Metadata is keyed by where the entry really lands: `/bin/su` from a package is
    // `/usr/bin/su` in a merged-/usr image, and the image writers walk the real tree.
    let landed = |host: &Path| match host.strip_prefix(root) {
        Ok(r) => format!("/{}", r.to_string_lossy()),
        Err(_) => rel.image_path(),
    };
    let key;
    if kind == Kind::Dir {
        let host = resolve_dir(root, &rel, true).map_err(perr)?;
        set_perm(&host, 0o755)?;
        key = landed(&host);
    } else {
        let (parent, name) = rel.split_last().expect("not the root");
        let dir = resolve_dir(root, &parent, true).map_err(perr)?;
        let host = dir.join(name);
        key = landed(&host);
        clear_slot(&host, &member)?;
        let werr = |source| ExtractError::Write {
            path: host.clone(),
            source,
        };
        match (ty, kind) {
            (tar::EntryType::Link, _) => {
                let link = entry
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                let target_rel = RelPath::parse(&link).map_err(perr)?;
                let target = resolve_existing(root, &target_rel).map_err(perr)?;
                match std::fs::symlink_metadata(&target) {
                    Ok(md) if md.is_file() => {}
                    _ => {
                        return Err(ExtractError::BadHardlink {
                            member,
                            target: target_rel.image_path(),
                        });
                    }
                }
                std::fs::hard_link(&target, &host).map_err(werr)?;
            }
            (_, Kind::File) => {
                let mut f = std::fs::File::create(&host).map_err(werr)?;
                io::copy(entry, &mut f).map_err(ExtractError::Read)?;
                // Never setuid/setgid on the host: the image writer applies those bits.
                f.set_permissions(std::fs::Permissions::from_mode(perm & 0o777 | 0o600))
                    .map_err(werr)?;
            }
            (_, Kind::Symlink) => {
                let link = entry
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                // The target is stored as-is: it is only ever resolved inside the rootfs
                // (here) or inside the guest.
                let target = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&link);
                std::os::unix::fs::symlink(target, &host).map_err(werr)?;
            }
            // Device nodes and FIFOs exist only in the records; the image writer makes them.
            _ => {}
        }
    }
    records.insert(key.clone(), meta);
    Ok(Extracted {
        path: rel.image_path(),
        landed: key,
        kind,
    })
}

/// Makes room for a non-directory at `host`: an old file or symlink is replaced (as dpkg
/// does on upgrade), a directory is an error.
fn clear_slot(host: &Path, member: &str) -> Result<(), ExtractError> {
    match std::fs::symlink_metadata(host) {
        Ok(md) if md.is_dir() => Err(ExtractError::DirConflict {
            member: member.into(),
            path: host.display().to_string(),
        }),
        Ok(_) => std::fs::remove_file(host).map_err(|source| ExtractError::Write {
            path: host.into(),
            source,
        }),
        Err(_) => Ok(()),
    }
}

fn set_perm(host: &Path, mode: u32) -> Result<(), ExtractError> {
    std::fs::set_permissions(host, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        ExtractError::Write {
            path: host.into(),
            source,
        }
    })
}
