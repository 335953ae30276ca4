//! A VM back from a job checkpoint: its saved disk overlay (the caller copied it into a fresh
//! scratch directory) is pointed at this node's own copy of the image, the hypervisor loads
//! the saved state, a new guest agent link connects, and only then the guest runs: what it
//! writes from its first instant reaches the link, whose request ids start above the old
//! link's, so it can adopt the rank's command still running in the guest.

use crate::boot::{BootError, BootOptions, OverlayDir, RunningVm, running};
use crate::spec::VmSpec;
use std::path::Path;
use v2m::Plugin;
use v2m::overlay::adopt_overlay;

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
    let qemu_img = crate::boot::qemu_img()?;
    adopt_overlay(&qemu_img, &disk, &root).map_err(BootError::Overlay)?;
    let profile = spec.profile(&disk);
    let vm = (plugin.restore_paused(&profile, state)).map_err(BootError::Start)?;
    running(vm, profile, opts, Some(overlay))
}
