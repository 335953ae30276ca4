//! The root disk: raw ext4 made without mounting (`mke2fs -d`), then patched so the recorded
//! ownership, setuid bits and device nodes reach the image even when the build ran as an
//! ordinary user (`debugfs -w`, only when there is any), and every timestamp is the build
//! epoch ([`stamp`]); byte-identical output: fixed UUID and hash seed, `E2FSPROGS_FAKE_TIME`.

mod stamp;

use crate::deb::{Kind, Records};
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "{tool} is needed to write the root disk but could not run: {source}; hint: apt-get install e2fsprogs"
    )]
    Tool {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        tool: &'static str,
        status: String,
        stderr: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path:?}: file names with quotes or newlines cannot be written to the image")]
    BadName { path: String },
}

/// A disk tool that is not installed is a missing component (the hint says which package).
impl vse_exit::Classify for DiskError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            DiskError::Tool { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                vse_exit::ErrorKind::MissingComponent
            }
            DiskError::BadName { .. } => vse_exit::ErrorKind::InvalidInput,
            _ => vse_exit::ErrorKind::Internal,
        }
    }
}

/// Fixed identity of every VSE root filesystem: same lock, same bytes.
pub const ROOT_UUID: &str = "5f1e0c2a-7d3b-4e59-9a61-0c5e2b7d8f10";
pub const ROOT_LABEL: &str = "vse-root";

/// Writes `out` (raw ext4) from `root`; `free_mib` is left free for jobs. Returns its size.
pub fn write_ext4(
    root: &Path,
    records: &Records,
    out: &Path,
    epoch: u64,
    free_mib: u64,
) -> Result<u64, DiskError> {
    let mut entries = Vec::new();
    walk(root, "", &mut entries)?;
    let mut bytes = 0u64;
    for (_, md) in &entries {
        bytes += md.len().div_ceil(4096) * 4096 + 256;
    }
    let inodes = (entries.len() as u64 * 2).max(4096) + free_mib * 16;
    // ext4 metadata (journal, inode tables) plus 20% headroom.
    let size_mib = (bytes + inodes * 256) / (1 << 20) * 6 / 5 + 64 + free_mib;
    let _ = std::fs::remove_file(out);
    let epoch_s = epoch.to_string();
    let mke2fs = Command::new("mke2fs")
        .args([
            "-q", "-F", "-t", "ext4", "-b", "4096", "-L", ROOT_LABEL, "-U", ROOT_UUID, "-N",
        ])
        .arg(inodes.to_string())
        .arg("-E")
        .arg(format!(
            "hash_seed={ROOT_UUID},root_owner=0:0,lazy_itable_init=0"
        ))
        .arg("-d")
        .arg(root)
        .arg(out)
        .arg(format!("{size_mib}M"))
        .env("E2FSPROGS_FAKE_TIME", &epoch_s)
        .env("MKE2FS_DEVICE_SECTSIZE", "512")
        .output()
        .map_err(|source| DiskError::Tool {
            tool: "mke2fs",
            source,
        })?;
    if !mke2fs.status.success() {
        return Err(DiskError::Failed {
            tool: "mke2fs",
            status: mke2fs.status.to_string(),
            stderr: String::from_utf8_lossy(&mke2fs.stderr).into_owned(),
        });
    }
    let script = debugfs_script(&entries, records)?;
    if !script.is_empty() {
        debugfs(out, &script, &epoch_s)?;
    }
    let io = |source| DiskError::Io {
        path: out.to_path_buf(),
        source,
    };
    let image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(out)
        .map_err(io)?;
    stamp::stamp_times(&image, epoch).map_err(io)?;
    // mke2fs and debugfs synced what they wrote; the stamped inode tables must be as durable.
    image.sync_all().map_err(io)?;
    Ok(size_mib << 20)
}

/// Runs the `debugfs -w` commands `script` on the image `out`.
fn debugfs(out: &Path, script: &str, epoch_s: &str) -> Result<(), DiskError> {
    let script_path = out.with_extension("debugfs");
    std::fs::write(&script_path, script).map_err(|source| DiskError::Io {
        path: script_path.clone(),
        source,
    })?;
    let dbg = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&script_path)
        .arg(out)
        .env("E2FSPROGS_FAKE_TIME", epoch_s)
        .output()
        .map_err(|source| DiskError::Tool {
            tool: "debugfs",
            source,
        })?;
    let _ = std::fs::remove_file(&script_path);
    // debugfs exits 0 even when a command fails; its errors name the command.
    let stderr = String::from_utf8_lossy(&dbg.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("debugfs ") && !l.trim().is_empty())
        .collect();
    if !dbg.status.success() || !errors.is_empty() {
        return Err(DiskError::Failed {
            tool: "debugfs",
            status: dbg.status.to_string(),
            stderr: errors.join("\n"),
        });
    }
    Ok(())
}

/// Every path under `root` (image path, lstat), sorted, directories before their content.
fn walk(
    root: &Path,
    rel: &str,
    out: &mut Vec<(String, std::fs::Metadata)>,
) -> Result<(), DiskError> {
    let host = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let io = |source| DiskError::Io {
        path: host.clone(),
        source,
    };
    let md = std::fs::symlink_metadata(&host).map_err(io)?;
    let is_dir = md.is_dir();
    out.push((format!("/{rel}"), md));
    if is_dir {
        let mut names: Vec<_> = std::fs::read_dir(&host)
            .map_err(io)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io)?;
        names.sort();
        for n in names {
            let child = if rel.is_empty() {
                n.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", n.to_string_lossy())
            };
            walk(root, &child, out)?;
        }
    }
    Ok(())
}

fn quoted(path: &str) -> Result<String, DiskError> {
    if path.contains(['"', '\n', '\\']) {
        return Err(DiskError::BadName { path: path.into() });
    }
    Ok(format!("\"{path}\""))
}

/// The `debugfs` commands that give the image the recorded owners, modes and special files
/// (none when the tree already has them). Timestamps are [`stamp`]'s.
fn debugfs_script(
    entries: &[(String, std::fs::Metadata)],
    records: &Records,
) -> Result<String, DiskError> {
    let mut s = String::new();
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    let builder_uid = unsafe { libc::geteuid() };
    for (path, md) in entries {
        let q = quoted(path)?;
        let rec = records.get(path.as_str());
        // Files the builder created as a non-root user belong to root in the image.
        let (want_uid, want_gid) = match rec {
            Some(r) => (r.uid, r.gid),
            None if md.uid() == builder_uid => (0, 0),
            None => (md.uid(), md.gid()),
        };
        if want_uid != md.uid() {
            let _ = writeln!(s, "sif {q} uid {want_uid}");
        }
        if want_gid != md.gid() {
            let _ = writeln!(s, "sif {q} gid {want_gid}");
        }
        if let Some(r) = rec
            && r.kind != Kind::Symlink
            && r.perm != md.mode() & 0o7777
        {
            let _ = writeln!(s, "sif {q} mode 0{:o}", (md.mode() & 0o170000) | r.perm);
        }
    }
    // Device nodes and FIFOs exist only in the records.
    for (path, r) in records {
        let (ty, major, minor) = match r.kind {
            Kind::CharDev { major, minor } => ("c", major, minor),
            Kind::BlockDev { major, minor } => ("b", major, minor),
            Kind::Fifo => ("p", 0, 0),
            _ => continue,
        };
        let q = quoted(path)?;
        // debugfs's mknod links its argument as one name into the current directory, so it
        // is made from inside its parent.
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = if parent.is_empty() { "/" } else { parent };
        let _ = writeln!(s, "cd {}", quoted(parent)?);
        let n = quoted(name)?;
        if ty == "p" {
            let _ = writeln!(s, "mknod {n} p");
        } else {
            let _ = writeln!(s, "mknod {n} {ty} {major} {minor}");
        }
        let _ = writeln!(s, "cd /");
        let _ = writeln!(s, "sif {q} uid {}\nsif {q} gid {}", r.uid, r.gid);
        let kind_bits = match ty {
            "c" => 0o020000,
            "b" => 0o060000,
            _ => 0o010000,
        };
        let _ = writeln!(s, "sif {q} mode 0{:o}", kind_bits | r.perm);
    }
    Ok(s)
}

/// `qemu-img convert` to qcow2 (deterministic: no timestamps in the format).
pub fn to_qcow2(raw: &Path, out: &Path) -> Result<(), DiskError> {
    let o = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(raw)
        .arg(out)
        .output()
        .map_err(|source| DiskError::Tool {
            tool: "qemu-img",
            source,
        })?;
    if !o.status.success() {
        return Err(DiskError::Failed {
            tool: "qemu-img",
            status: o.status.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
