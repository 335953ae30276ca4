//! Per-VM copy-on-write overlays on one shared master image, created as one transaction: either
//! every overlay exists afterwards, or none does (hundreds of VMs of one job start from one image,
//! and a half-created set would leave some nodes without a disk).
//!
//! Overlays are qcow2 files with a backing file, made by `qemu-img create -b`; each is first
//! written under a temporary name and renamed into place only when all of them were created.

use crate::error::{Result, V2mError};
use crate::profile::DiskFormat;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayRequest {
    /// The shared master image (must exist, absolute path: it is recorded in the overlay).
    pub base: PathBuf,
    pub base_format: DiskFormat,
    /// Where the overlay goes (must not exist yet).
    pub path: PathBuf,
}

/// Creates all overlays or none. `qemu_img` is the `qemu-img` binary to use.
pub fn create_overlays(qemu_img: &Path, requests: &[OverlayRequest]) -> Result<Vec<PathBuf>> {
    for r in requests {
        if !r.base.is_absolute() {
            return Err(V2mError::Overlay {
                path: r.path.clone(),
                message: format!(
                    "backing image {} must be an absolute path",
                    r.base.display()
                ),
            });
        }
        if !r.base.is_file() {
            return Err(V2mError::Overlay {
                path: r.path.clone(),
                message: format!("backing image {} does not exist", r.base.display()),
            });
        }
        if r.path.exists() {
            return Err(V2mError::Overlay {
                path: r.path.clone(),
                message: "already exists (hint: remove the old VM's overlay first)".into(),
            });
        }
    }
    let mut seen = std::collections::HashSet::new();
    for r in requests {
        if !seen.insert(&r.path) {
            return Err(V2mError::Overlay {
                path: r.path.clone(),
                message: "requested twice in one transaction".into(),
            });
        }
    }
    let txn = format!(".v2m-tmp-{}", std::process::id());
    let tmp_of = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(&txn);
        PathBuf::from(s)
    };
    let mut staged: Vec<PathBuf> = Vec::new();
    let cleanup = |files: &[PathBuf]| {
        for f in files {
            let _ = std::fs::remove_file(f);
        }
    };
    for r in requests {
        let tmp = tmp_of(&r.path);
        let out = Command::new(qemu_img)
            .args([
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                r.base_format.as_str(),
                "-b",
            ])
            .arg(&r.base)
            .arg(&tmp)
            .output();
        let failure = match out {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(format!(
                "qemu-img failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
                "{} not found (hint: apt-get install qemu-utils)",
                qemu_img.display()
            )),
            Err(e) => Some(format!("cannot run {}: {e}", qemu_img.display())),
        };
        if let Some(message) = failure {
            let _ = std::fs::remove_file(&tmp);
            cleanup(&staged);
            return Err(V2mError::Overlay {
                path: r.path.clone(),
                message,
            });
        }
        staged.push(tmp);
    }
    let mut done: Vec<PathBuf> = Vec::new();
    for (r, tmp) in requests.iter().zip(&staged) {
        if let Err(e) = std::fs::rename(tmp, &r.path) {
            cleanup(&done);
            cleanup(&staged);
            return Err(V2mError::io("renaming overlay into place", &r.path, e));
        }
        done.push(r.path.clone());
    }
    Ok(done)
}

/// Takes an overlay written elsewhere (a job checkpoint's saved disk) for a VM here: it must be
/// a plain qcow2 file (no external data file, which would let the file name any path on this
/// host), and its backing file becomes `base`, this host's copy of the same image; its data
/// is not touched.
pub fn adopt_overlay(qemu_img: &Path, overlay: &Path, base: &Path) -> Result<()> {
    let fail = |message: String| V2mError::Overlay {
        path: overlay.to_path_buf(),
        message,
    };
    let run = |args: &[&std::ffi::OsStr]| {
        let o = Command::new(qemu_img)
            .args(args)
            .output()
            .map_err(|e| fail(format!("cannot run {}: {e}", qemu_img.display())))?;
        if !o.status.success() {
            return Err(fail(format!(
                "qemu-img failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        Ok(o.stdout)
    };
    let info = run(&[
        "info".as_ref(),
        "-f".as_ref(),
        "qcow2".as_ref(),
        "--output=json".as_ref(),
        overlay.as_os_str(),
    ])?;
    let info: serde_json::Value =
        serde_json::from_slice(&info).map_err(|e| fail(format!("qemu-img info: {e}")))?;
    if info.pointer("/format-specific/data/data-file").is_some() {
        return Err(fail("names an external data file; refused".into()));
    }
    run(&[
        "rebase".as_ref(),
        "-u".as_ref(),
        "-f".as_ref(),
        "qcow2".as_ref(),
        "-F".as_ref(),
        "raw".as_ref(),
        "-b".as_ref(),
        base.as_os_str(),
        overlay.as_os_str(),
    ])?;
    Ok(())
}
