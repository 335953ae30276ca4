//! Image → running VM: a scratch directory with the VM's copy-on-write overlay of the image's
//! root disk, the V2M profile, define and start through the caller's plugin, the hypervisor
//! process into its node's cgroup, and the guest agent link once the guest answers. Any
//! failure on the way leaves nothing behind: the VM handle kills on drop, the scratch
//! directory goes with its guard.

use crate::process::{self, CgroupError};
use crate::spec::VmSpec;
use crate::template::{BootKind, Templates};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use v2m::overlay::{OverlayRequest, create_overlays};
use v2m::{DiskFormat, Plugin, Profile, StopOutcome, V2mError, Vm, VmName};
use vse_guest_agent::{GuestLink, LinkError, LinkOptions};

/// Scratch directories are named `vse-<prefix>-…`; only such directories are ever adopted
/// from a migrated VM's profile (see [`OverlayDir::adopt`]).
const SCRATCH: &str = "vse-";

/// Lines of the guest console an error report carries.
pub const CONSOLE_LINES: usize = 30;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("creating the VM's scratch directory: {0}")]
    Scratch(#[source] std::io::Error),
    #[error("the VM's disk overlay: {0}")]
    Overlay(#[source] V2mError),
    #[error("the image has no root disk to boot on")]
    NoRootDisk,
    #[error("defining the VM: {0}")]
    Define(#[source] V2mError),
    #[error("starting the VM: {0}")]
    Start(#[source] V2mError),
    #[error("VM {0}: the hypervisor process has no pid")]
    NoPid(String),
    #[error("VM {0}: no guest agent channel")]
    NoAgentChannel(String),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    TooLarge(#[from] crate::fit::TooLarge),
    #[error("waiting for the guest agent: {source}\nguest console (last lines):\n{console}")]
    Agent {
        #[source]
        source: LinkError,
        console: String,
    },
}

/// Too large for the job is the user's to fix; the rest is the host's or the hypervisor's.
impl vse_exit::Classify for BootError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            BootError::TooLarge(_) => vse_exit::ErrorKind::InvalidInput,
            BootError::Start(e) | BootError::Define(e) | BootError::Overlay(e) => e.kind(),
            _ => vse_exit::ErrorKind::Internal,
        }
    }
}

/// How a VM boots on this host (the plugin is the caller's choice, see `v2m::registry`).
#[derive(Debug, Clone)]
pub struct BootOptions {
    /// Names the VM's scratch directory in the temporary directory (`vse-<prefix>-…`).
    pub scratch_prefix: String,
    /// Where the scratch directory goes instead of the temporary directory (a service that
    /// dropped its privileges boots into a directory of the user's, whatever `TMPDIR` says).
    pub scratch_parent: Option<PathBuf>,
    /// The node's cgroup (a share of a machine several test nodes share): the hypervisor
    /// process goes there.
    pub cgroup: Option<PathBuf>,
    /// The guest agent link: where barrier lines go, how long the boot may take, and a flag
    /// that gives up the wait (the job is being torn down).
    pub agent: LinkOptions,
    /// Boot templates of this node: restore from one when it exists, save one after a cold
    /// boot otherwise (see [`crate::template`]). `None`: always boot cold.
    pub templates: Option<Templates>,
}

impl BootOptions {
    pub fn new(scratch_prefix: &str, boot_timeout: Duration) -> Self {
        BootOptions {
            scratch_prefix: scratch_prefix.to_string(),
            scratch_parent: None,
            cgroup: None,
            agent: LinkOptions::new(boot_timeout),
            templates: None,
        }
    }
}

/// The scratch directory of one VM (its disk overlay): removed on drop, after the VM.
#[derive(Debug)]
pub struct OverlayDir {
    path: PathBuf,
    keep: bool,
}

impl OverlayDir {
    /// A new, empty scratch directory `vse-<prefix>-…` in the temporary directory.
    pub fn create(prefix: &str) -> std::io::Result<Self> {
        Self::create_in(prefix, None)
    }

    /// As [`OverlayDir::create`], in `parent` when given.
    pub fn create_in(prefix: &str, parent: Option<&Path>) -> std::io::Result<Self> {
        let name = format!("{SCRATCH}{prefix}-");
        let mut b = tempfile::Builder::new();
        b.prefix(&name);
        let dir = match parent {
            Some(p) => b.tempdir_in(p)?,
            None => b.tempdir()?,
        };
        Ok(OverlayDir {
            path: dir.keep(),
            keep: false,
        })
    }

    /// Takes over the scratch directory holding `disk`, the first disk of a VM that migrated
    /// here from another process (which left it in place): it goes when the VM ends here.
    /// Only a directory named like the ones [`boot`] makes is taken.
    pub fn adopt(disk: &Path) -> Option<Self> {
        let dir = disk.parent()?;
        let named = dir
            .file_name()?
            .to_str()
            .is_some_and(|n| n.starts_with(SCRATCH));
        (named && dir.is_dir()).then(|| OverlayDir {
            path: dir.to_path_buf(),
            keep: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place (another process owns it from now on).
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for OverlayDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A VM that runs with its guest agent answering. Dropping it stops the VM (kill-on-drop
/// handle), closes the link and removes the scratch directory, in that order.
pub struct RunningVm {
    pub(crate) vm: Box<dyn Vm>,
    pub(crate) link: Arc<GuestLink>,
    pub(crate) pid: u32,
    pub(crate) profile: Profile,
    pub(crate) overlay: Option<OverlayDir>,
    pub(crate) kind: BootKind,
    /// From the hypervisor running to the guest agent answering (zero for a VM that came
    /// here by migration).
    pub(crate) guest_wait: Duration,
}

impl std::fmt::Debug for RunningVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningVm")
            .field("name", self.vm.name())
            .field("pid", &self.pid)
            .field("overlay", &self.overlay)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl RunningVm {
    pub fn name(&self) -> &VmName {
        self.vm.name()
    }

    pub fn vm(&self) -> &dyn Vm {
        &*self.vm
    }

    pub fn vm_mut(&mut self) -> &mut dyn Vm {
        &mut *self.vm
    }

    /// The guest agent link (shared: the sampler and the rank's waiter use it too).
    pub fn link(&self) -> &Arc<GuestLink> {
        &self.link
    }

    /// The hypervisor process (the host's view of the VM: RSS and CPU time).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The profile the VM runs with (a migration's destination is prepared from it).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// How the VM came to run: booted cold, booted cold and saved as a template, or
    /// restored from a template.
    pub fn boot_kind(&self) -> BootKind {
        self.kind
    }

    /// How long the guest took, once its hypervisor ran, to answer on the agent link: the
    /// guest's own boot, apart from the host's work before it.
    pub fn guest_wait(&self) -> Duration {
        self.guest_wait
    }

    /// Whether the VM was restored from a boot template rather than booted.
    pub fn from_template(&self) -> bool {
        self.kind == BootKind::FromTemplate
    }

    /// Whether the hypervisor process still runs.
    pub fn alive(&self) -> bool {
        process::alive(self.pid)
    }

    /// The last `lines` lines of the guest's serial console, for error reports.
    pub fn console_tail(&self, lines: usize) -> String {
        console_tail(&*self.vm, lines)
    }

    /// Asks the guest to power off, waits up to `grace`, then forces it off.
    pub fn stop(&mut self, grace: Duration) -> Result<StopOutcome, V2mError> {
        self.vm.stop(grace)
    }

    /// The scratch directory guard, to hand to the destination of a migration in this
    /// process (see [`RunningVm::set_overlay`]).
    pub fn take_overlay(&mut self) -> Option<OverlayDir> {
        self.overlay.take()
    }

    pub fn set_overlay(&mut self, overlay: Option<OverlayDir>) {
        self.overlay = overlay;
    }

    /// The VM now runs elsewhere (a live migration completed): the source's stopped
    /// hypervisor is reaped and the disk overlay is left to the destination, which opened it.
    pub fn migrated_away(mut self) {
        if let Some(o) = self.overlay.take() {
            o.keep();
        }
    }
}

/// The last `lines` lines of a VM's serial console.
pub fn console_tail(vm: &dyn Vm, lines: usize) -> String {
    let log = vm.console_log().unwrap_or_default();
    let text = String::from_utf8_lossy(&log);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Boots one VM of an image on a fresh copy-on-write overlay of its root disk, through
/// `plugin`, and connects its guest agent; with `opts.templates`, from the boot template of
/// its image and profile when this node has one (see [`RunningVm::boot_kind`]).
pub fn boot(
    plugin: &dyn Plugin,
    spec: &VmSpec,
    opts: &BootOptions,
) -> Result<RunningVm, BootError> {
    // The hypervisor stays in this process's cgroup (a batch job's) unless the caller names
    // the node's: a VM that cannot fit there would be killed by the OOM killer mid-job.
    if opts.cgroup.is_none() {
        crate::fit::check(spec.memory_mib, 1)?;
    }
    match &opts.templates {
        Some(t) => crate::template::boot(t, plugin, spec, opts),
        None => boot_cold(plugin, spec, opts),
    }
}

/// [`boot`] from the kernel.
pub(crate) fn boot_cold(
    plugin: &dyn Plugin,
    spec: &VmSpec,
    opts: &BootOptions,
) -> Result<RunningVm, BootError> {
    let root = spec
        .image()
        .root_disk
        .clone()
        .ok_or(BootError::NoRootDisk)?;
    let overlay = OverlayDir::create_in(&opts.scratch_prefix, opts.scratch_parent.as_deref())
        .map_err(BootError::Scratch)?;
    let disk = overlay.path().join("root.qcow2");
    let qemu_img = qemu_img()?;
    create_overlays(
        &qemu_img,
        &[OverlayRequest {
            base: root,
            base_format: DiskFormat::Raw,
            path: disk.clone(),
        }],
    )
    .map_err(BootError::Overlay)?;
    let mut running = boot_profile(plugin, spec.profile(&disk), opts)?;
    running.overlay = Some(overlay);
    Ok(running)
}

/// The `qemu-img` that makes and adopts overlays.
pub(crate) fn qemu_img() -> Result<PathBuf, BootError> {
    v2m::which::find_binary(Path::new("qemu-img")).ok_or_else(|| {
        BootError::Overlay(V2mError::BinaryNotFound {
            binary: "qemu-img".into(),
            hint: "apt-get install qemu-utils".into(),
        })
    })
}

/// Boots a VM from a ready profile whose disks (if any) the caller owns, and connects its
/// guest agent (test guests that run from their initramfs; the daemon's fleet).
pub fn boot_profile(
    plugin: &dyn Plugin,
    profile: Profile,
    opts: &BootOptions,
) -> Result<RunningVm, BootError> {
    let mut vm = plugin.define(&profile).map_err(BootError::Define)?;
    vm.start().map_err(BootError::Start)?;
    running(vm, profile, opts, None)
}

/// A started VM, its hypervisor in the node's cgroup and its guest agent answering. A VM
/// restored paused (`Plugin::restore_paused`) is resumed once the link listens.
pub(crate) fn running(
    mut vm: Box<dyn Vm>,
    profile: Profile,
    opts: &BootOptions,
    overlay: Option<OverlayDir>,
) -> Result<RunningVm, BootError> {
    let name = profile.name.to_string();
    let status = vm.status().ok();
    let paused = status
        .as_ref()
        .is_some_and(|s| s.state == v2m::VmState::Paused);
    let pid = (status.and_then(|s| s.pid)).ok_or_else(|| BootError::NoPid(name.clone()))?;
    if let Some(dir) = &opts.cgroup {
        process::enter_cgroup(dir, pid)?;
    }
    let sock = vm
        .agent_socket()
        .map(Path::to_path_buf)
        .ok_or(BootError::NoAgentChannel(name))?;
    let channel = vm.take_agent_channel();
    let run = || match paused {
        true => vm.resume().map_err(|e| e.to_string()),
        false => Ok(()),
    };
    let waiting = std::time::Instant::now();
    let link = GuestLink::connect_then(&sock, channel, &opts.agent, run);
    let link = link.map_err(|source| BootError::Agent {
        console: console_tail(&*vm, CONSOLE_LINES),
        source,
    })?;
    Ok(RunningVm {
        vm,
        link: Arc::new(link),
        pid,
        profile,
        overlay,
        kind: BootKind::Cold,
        guest_wait: waiting.elapsed(),
    })
}
