//! A VM back from a job checkpoint: its saved disk overlay (the caller copied it into a fresh
//! scratch directory) is pointed at this node's own copy of the image, the hypervisor loads
//! the saved state and runs it, and a new guest agent link takes over (its request ids start
//! above the old link's, so it can adopt the rank's command still running in the guest).

use crate::boot::{BootError, BootOptions, CONSOLE_LINES, OverlayDir, RunningVm, console_tail};
use crate::process;
use crate::spec::VmSpec;
use std::path::Path;
use std::sync::Arc;
use v2m::overlay::adopt_overlay;
use v2m::{Plugin, V2mError};
use vse_guest_agent::GuestLink;

/// The overlay's file name inside its scratch directory, as [`crate::boot`] names it.
pub const OVERLAY_FILE: &str = "root.qcow2";

/// Restores the VM `spec` describes from `state`, on the overlay `overlay/root.qcow2`.
pub fn restore(
    plugin: &dyn Plugin,
    spec: &VmSpec,
    state: &Path,
    overlay: OverlayDir,
    opts: &BootOptions,
) -> Result<RunningVm, BootError> {
    let root = spec
        .image()
        .root_disk
        .clone()
        .ok_or(BootError::NoRootDisk)?;
    let disk = overlay.path().join(OVERLAY_FILE);
    let qemu_img = v2m::which::find_binary(Path::new("qemu-img")).ok_or_else(|| {
        BootError::Overlay(V2mError::BinaryNotFound {
            binary: "qemu-img".into(),
            hint: "apt-get install qemu-utils".into(),
        })
    })?;
    adopt_overlay(&qemu_img, &disk, &root).map_err(BootError::Overlay)?;
    let profile = spec.profile(&disk);
    let name = profile.name.to_string();
    let mut vm = plugin.restore(&profile, state).map_err(BootError::Start)?;
    let pid = vm
        .status()
        .ok()
        .and_then(|s| s.pid)
        .ok_or_else(|| BootError::NoPid(name.clone()))?;
    if let Some(dir) = &opts.cgroup {
        process::enter_cgroup(dir, pid)?;
    }
    let sock = vm
        .agent_socket()
        .map(Path::to_path_buf)
        .ok_or(BootError::NoAgentChannel(name))?;
    let link = GuestLink::connect(&sock, &opts.agent).map_err(|source| BootError::Agent {
        console: console_tail(&*vm, CONSOLE_LINES),
        source,
    })?;
    Ok(RunningVm {
        vm,
        link: Arc::new(link),
        pid,
        profile,
        overlay: Some(overlay),
    })
}
