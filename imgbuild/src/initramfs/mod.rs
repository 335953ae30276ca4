//! The initramfs (cpio newc, gzip): busybox, the virtio and Xen front-end drivers with their
//! dependencies, and an `/init` that mounts the root disk and switches to it. Loading those
//! drivers early is what lets one image boot under every hypervisor.

pub mod cpio;
pub mod modules;

use crate::rootfs::inroot::InRoot;
use cpio::{Body, CpioWriter};
use modules::{ModuleError, ModuleTree, read_module};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Drivers the root disk and the agent channel need under QEMU/KVM.
pub const REQUIRED_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_console",
    "virtio_net",
    "ext4",
];
/// Drivers for other hypervisors and vsock; a kernel without them still boots under QEMU.
pub const OPTIONAL_MODULES: &[&str] = &[
    "virtio_mmio",
    "vmw_vsock_virtio_transport",
    "xen-blkfront",
    "xen-netfront",
    "crc32c_generic",
    // Host directory shares (FUSE over the agent channel); without it a share cannot mount.
    "fuse",
];

const INIT: &str = include_str!("init.sh");

#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error(
        "the image has no static busybox at /usr/bin/busybox; hint: lock the busybox-static package (the initramfs runs on it)"
    )]
    NoBusybox,
    #[error(
        "/usr/bin/busybox in the image is dynamically linked (the `busybox` package) and cannot run in the initramfs; hint: lock `busybox-static` instead (it provides the same shell)"
    )]
    DynamicBusybox,
    #[error("writing the initramfs {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What went into the initramfs (recorded in the manifest).
pub use vse_image::InitramfsInfo;

/// Writes `out` for kernel `kver` of the unpacked image at `root`.
pub fn build(
    root: &Path,
    kver: &str,
    out: &Path,
    epoch: u64,
) -> Result<InitramfsInfo, InitramfsError> {
    // Untrusted commands ran in the root: every read resolves inside it.
    let image = InRoot::open(root).map_err(|source| InitramfsError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let busybox = image
        .read("usr/bin/busybox")
        .map_err(|_| InitramfsError::NoBusybox)?;
    if has_interpreter(&busybox) {
        return Err(InitramfsError::DynamicBusybox);
    }
    let tree = ModuleTree::scan(&image, &format!("usr/lib/modules/{kver}"), kver)?;
    let mods = tree.closure(&image, REQUIRED_MODULES, OPTIONAL_MODULES)?;
    let all: Vec<&str> = REQUIRED_MODULES
        .iter()
        .chain(OPTIONAL_MODULES)
        .copied()
        .collect();
    let info = InitramfsInfo {
        modules: mods.iter().map(|(n, _)| n.clone()).collect(),
        builtin: all
            .iter()
            .filter(|m| tree.is_builtin(m))
            .map(|m| m.to_string())
            .collect(),
        unavailable: all
            .iter()
            .filter(|m| !tree.has(m))
            .map(|m| m.to_string())
            .collect(),
    };
    let io = |source| InitramfsError::Io {
        path: out.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(out).map_err(io)?;
    // mtime 0 and no file name in the gzip header: byte-identical output.
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(std::io::BufWriter::new(file), flate2::Compression::new(6));
    let mut w = CpioWriter::new(gz, epoch);
    for d in ["bin", "dev", "modules", "newroot", "proc", "sys"] {
        w.add(d, 0o755, Body::Dir).map_err(io)?;
    }
    w.add("bin/busybox", 0o755, Body::File(&busybox))
        .map_err(io)?;
    for applet in [
        "sh",
        "mount",
        "insmod",
        "switch_root",
        "mkdir",
        "cat",
        "poweroff",
        "umount",
        "usleep",
    ] {
        w.add(&format!("bin/{applet}"), 0o777, Body::Symlink("busybox"))
            .map_err(io)?;
    }
    w.add("init", 0o755, Body::File(INIT.as_bytes()))
        .map_err(io)?;
    let mut order = String::new();
    for (name, path) in &mods {
        let data = read_module(&image, path)?;
        w.add(&format!("modules/{name}.ko"), 0o644, Body::File(&data))
            .map_err(io)?;
        order.push_str(name);
        order.push('\n');
    }
    w.add("modules/order", 0o644, Body::File(order.as_bytes()))
        .map_err(io)?;
    let gz = w.finish().map_err(io)?;
    let mut buf = gz.finish().map_err(io)?;
    buf.flush().map_err(io)?;
    buf.get_ref().sync_all().map_err(io)?;
    Ok(info)
}

/// Whether an ELF64 executable names a program interpreter (`PT_INTERP`): a dynamically
/// linked binary, which the initramfs (no libc, no loader) cannot run.
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..phnum as usize).any(|i| {
        usize::try_from(phoff)
            .ok()
            .and_then(|off| off.checked_add(i * phentsize as usize))
            .and_then(u32_at)
            == Some(PT_INTERP)
    })
}

#[cfg(test)]
mod elf_tests {
    use super::has_interpreter;

    #[test]
    fn host_binaries_are_classified() {
        // /bin/sh on Debian is dash, dynamically linked; not an ELF: no interpreter.
        let dynamic = std::fs::read("/bin/sh").expect("/bin/sh");
        assert!(has_interpreter(&dynamic));
        assert!(!has_interpreter(b"#!/bin/sh\n"));
        if let Ok(stat) = std::fs::read("/bin/busybox") {
            // busybox-static on the host (installed by .ci/run) is statically linked.
            let static_pkg = std::process::Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", "busybox-static"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ok installed"));
            if static_pkg {
                assert!(!has_interpreter(&stat));
            }
        }
    }
}
