//! Node-local copies of the guest for the runs without shared storage: each "node" has its own
//! image directory (kernel, initramfs, a raw root disk of zeros, the manifest), as `vse launch`
//! stages one per node, so a destination never opens a file of the source; the data the guest
//! writes to its disk before the runs.

use crate::BenchError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use v2m::ImageRef;
use vse_guest_agent::GuestLink;
use vse_image::{ImageDir, MANIFEST, Manifest, Part};

/// One node's copy of `guest` in `dir`, with a `disk_mib` raw root disk.
pub(super) fn node_image(
    dir: &Path,
    guest: &ImageRef,
    disk_mib: u64,
) -> Result<ImageDir, BenchError> {
    let io = |what: &str| BenchError::io(format!("{what} in {}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io("creating the node's image directory"))?;
    let initrd = guest
        .initrd
        .as_ref()
        .ok_or_else(|| BenchError::Invalid("the guest env file names no initramfs".into()))?;
    std::fs::copy(&guest.kernel, dir.join("vmlinuz")).map_err(io("copying the kernel"))?;
    std::fs::copy(initrd, dir.join("initrd.img")).map_err(io("copying the initramfs"))?;
    std::fs::File::create(dir.join("root.raw"))
        .and_then(|f| f.set_len(disk_mib << 20))
        .map_err(io("creating the root disk"))?;
    let mut parts = BTreeMap::new();
    for (name, file) in [
        ("kernel", "vmlinuz"),
        ("initrd", "initrd.img"),
        ("root", "root.raw"),
    ] {
        let size = std::fs::metadata(dir.join(file))
            .map_err(io("reading a part's size"))?
            .len();
        let part = Part {
            file: file.into(),
            size,
            sha256: String::new(),
        };
        parts.insert(name.to_string(), part);
    }
    let m = Manifest::assembled("vse bench migrate", &guest.cmdline, parts);
    let text = serde_json::to_vec(&m)
        .map_err(|e| BenchError::Failed(format!("serialising the manifest: {e}")))?;
    std::fs::write(dir.join(MANIFEST), text).map_err(io("writing the manifest"))?;
    Ok(ImageDir::open(dir)?)
}

/// A fresh qcow2 overlay `path` over the raw `base`.
pub(super) fn overlay(base: &Path, path: &Path) -> Result<PathBuf, BenchError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(BenchError::io(format!("creating {}", dir.display())))?;
    }
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .map_err(BenchError::io(
            "running qemu-img (apt-get install qemu-utils)",
        ))?;
    if !st.success() {
        return Err(BenchError::Failed(format!(
            "qemu-img create {} failed: {st}",
            path.display()
        )));
    }
    Ok(path.to_path_buf())
}

/// `mib` MiB of random data written by the guest (through its agent) straight to its disk,
/// synced: both guests, vse's and the plain QEMU one, have the same history before they move
/// (the data on disk, and the page cache it went through in memory).
pub(super) fn write_data(link: &GuestLink, mib: u64) -> Result<(), BenchError> {
    if mib == 0 {
        return Ok(());
    }
    let script =
        format!("dd if=/dev/urandom of=/dev/vda bs=1M count={mib} conv=fsync 2>&1 && sync");
    let mut out = String::new();
    let status = link
        .run(&["sh", "-c", &script], BTreeMap::new(), &mut |_, d| {
            out.push_str(d)
        })
        .map_err(|e| BenchError::Failed(format!("writing the guest's disk: {e}")))?;
    if status != 0 {
        return Err(BenchError::Failed(format!(
            "writing the guest's disk exited {status}: {out}"
        )));
    }
    Ok(())
}
