//! Live migration of a running VM, in the steps both ends take — whether the two ends are
//! two node agents talking over the job's overlay or one process holding both (the daemon's
//! fleet on one machine):
//!
//! 1. destination: [`Incoming::prepare`] — a VM from the source's profile, waiting for the
//!    state at a listening address;
//! 2. source: [`send`] — the state, with explicit bandwidth, downtime and time limits; on
//!    failure the source keeps running and the destination is dropped (killed);
//! 3. destination: [`Incoming::finish`] — the VM runs here; then its guest agent link
//!    follows it: [`Arrived::reattach`] moves the link this process holds, [`Arrived::connect`]
//!    makes a new one whose request ids start above the old one's, so it can adopt the
//!    running command by its request id (`GuestLink::adopt_exec`).
//!
//! Both ends take the migration's key: with it the stream is TLS with that pre-shared key
//! (QEMU's `tls-creds-psk`), so the destination's listener, reachable by anyone on the
//! network, takes the state only from the source that holds the key; a stranger's connection
//! fails the handshake and the listener keeps waiting for the real one.
//!
//! The VM's disk is its copy-on-write overlay. With [`DestDisks::Shared`] (the source's probe
//! was visible here, see [`crate::storage`]) the destination opens the same path; with
//! [`DestDisks::Copy`] it makes its own fresh overlay over its own copy of the base image and
//! exports it, and [`send_disks`] mirrors the overlay's allocated clusters there before the
//! memory moves.

use crate::boot::{OverlayDir, RunningVm};
use crate::process::{self, CgroupError};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use v2m::overlay::{OverlayRequest, create_overlays};
use v2m::{
    DiskFormat, DiskMigration, MigrationKey, MigrationParams, MigrationReport, MigrationTarget,
    Plugin, Profile, V2mError, Vm,
};
use vse_guest_agent::{GuestLink, LinkError, LinkOptions};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "{}: the VM's disk is not visible on this node; live migration needs the source's disk overlay on shared storage (or both nodes on one machine)",
        .0.display()
    )]
    DiskNotVisible(PathBuf),
    #[error("cannot copy the VM's disk to this node: {0}")]
    CannotCopy(String),
    #[error("creating the destination's scratch directory: {0}")]
    Scratch(#[source] std::io::Error),
    #[error("the destination's own disk overlay: {0}")]
    Overlay(#[source] V2mError),
    #[error("preparing the incoming VM: {0}")]
    Prepare(#[source] V2mError),
    #[error("the incoming VM has no pid")]
    NoPid,
    #[error("the incoming VM reports no listening address")]
    NoAddress,
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("sending the state: {0}")]
    Send(#[source] V2mError),
    #[error("the incoming VM did not take over: {0}")]
    Finish(#[source] V2mError),
    #[error("the VM has no guest agent channel")]
    NoAgentChannel,
    #[error(
        "connecting to the guest agent after the migration: {source}\nguest console (last lines):\n{console}"
    )]
    Agent {
        #[source]
        source: LinkError,
        console: String,
    },
}

/// Where the destination's disks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestDisks<'a> {
    /// The source's disk files, visible here at the same paths (shared storage).
    Shared,
    /// A fresh overlay of the profile's `image.root_disk` (this node's own copy) in a new
    /// scratch directory `vse-<scratch_prefix>-…`, filled by the source's mirror.
    Copy { scratch_prefix: &'a str },
}

/// The destination of a migration: a VM waiting for the state. Dropping it kills the VM,
/// then removes the overlay it made.
pub struct Incoming {
    vm: Box<dyn Vm>,
    pid: u32,
    addr: SocketAddr,
    profile: Profile,
    disks: DiskMigration,
    overlay: Option<OverlayDir>,
}

impl Incoming {
    /// Prepares `profile` (as the source runs it) to receive the state on `listen`, any free
    /// port, from the source holding `key` (None: from whoever connects first; loopback
    /// only); the hypervisor process joins `cgroup` when given.
    pub fn prepare(
        plugin: &dyn Plugin,
        profile: &Profile,
        listen: IpAddr,
        cgroup: Option<&Path>,
        key: Option<&MigrationKey>,
    ) -> Result<Incoming, MigrateError> {
        Self::prepare_with(plugin, profile, listen, cgroup, key, DestDisks::Shared)
    }

    /// [`Incoming::prepare`] with the disks from `disks`.
    pub fn prepare_with(
        plugin: &dyn Plugin,
        profile: &Profile,
        listen: IpAddr,
        cgroup: Option<&Path>,
        key: Option<&MigrationKey>,
        disks: DestDisks<'_>,
    ) -> Result<Incoming, MigrateError> {
        let (profile, overlay, disks) = match disks {
            DestDisks::Shared => {
                if let Some(d) = profile.disks.iter().find(|d| !d.path.exists()) {
                    return Err(MigrateError::DiskNotVisible(d.path.clone()));
                }
                (profile.clone(), None, DiskMigration::Shared)
            }
            DestDisks::Copy { scratch_prefix } => {
                let (p, o) = own_overlay(profile, scratch_prefix)?;
                (p, Some(o), DiskMigration::Copy { port: 0 })
            }
        };
        let target = MigrationTarget {
            host: listen.to_string(),
            port: 0,
            key: key.cloned(),
            disks,
        };
        let mut vm = plugin
            .prepare_incoming(&profile, &target)
            .map_err(MigrateError::Prepare)?;
        let pid = vm
            .status()
            .ok()
            .and_then(|s| s.pid)
            .ok_or(MigrateError::NoPid)?;
        if let Some(dir) = cgroup {
            process::enter_cgroup(dir, pid)?;
        }
        let at = vm.incoming().ok_or(MigrateError::NoAddress)?;
        let (port, disks) = (at.port, at.disks);
        Ok(Incoming {
            vm,
            pid,
            addr: SocketAddr::new(listen, port),
            profile,
            disks,
            overlay,
        })
    }

    /// How the source sends the disks: in place, or mirrored to the export this announces.
    pub fn disks(&self) -> DiskMigration {
        self.disks
    }

    /// The profile the destination runs (its own disk paths when copying).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Where the source sends the state.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits up to `timeout` for the state to arrive and the VM to run here.
    pub fn finish(self, timeout: Duration) -> Result<Arrived, MigrateError> {
        let Incoming {
            mut vm,
            pid,
            profile,
            overlay,
            ..
        } = self;
        vm.finish_incoming(timeout).map_err(MigrateError::Finish)?;
        let sock = vm
            .agent_socket()
            .map(Path::to_path_buf)
            .ok_or(MigrateError::NoAgentChannel)?;
        let channel = vm.take_agent_channel();
        Ok(Arrived {
            vm,
            pid,
            profile,
            sock,
            channel,
            overlay,
        })
    }
}

/// A migrated VM running here, before its guest agent link follows it. Dropping it stops
/// the VM.
pub struct Arrived {
    vm: Box<dyn Vm>,
    pid: u32,
    profile: Profile,
    sock: PathBuf,
    /// The agent channel the plugin connected before the state loaded, if it did.
    channel: Option<UnixStream>,
    /// The overlay this node made (disk copy); with shared storage the caller adopts the
    /// source's.
    overlay: Option<OverlayDir>,
}

impl Arrived {
    fn running(self, link: Arc<GuestLink>) -> RunningVm {
        RunningVm {
            vm: self.vm,
            link,
            pid: self.pid,
            profile: self.profile,
            overlay: self.overlay,
            kind: crate::template::BootKind::Cold,
            guest_wait: std::time::Duration::ZERO,
        }
    }

    /// A new link (another process held the old one): `opts.first_id` must lie above every
    /// request id the old link used, and `opts.carried` holds what the old link's
    /// [`GuestLink::detach`] returned.
    pub fn connect(mut self, opts: &LinkOptions) -> Result<RunningVm, MigrateError> {
        let channel = self.channel.take();
        let link = GuestLink::connect_then(&self.sock, channel, opts, || Ok(()));
        let link = link.map_err(|source| MigrateError::Agent {
            console: crate::boot::console_tail(&*self.vm, crate::boot::CONSOLE_LINES),
            source,
        })?;
        Ok(self.running(Arc::new(link)))
    }

    /// Moves the link this process holds to the VM's new channel. The VM runs here whatever
    /// the outcome: a link that did not reattach stays queued, and the caller decides.
    pub fn reattach(mut self, link: Arc<GuestLink>) -> (RunningVm, Result<(), LinkError>) {
        let r = link.reattach(&self.sock, self.channel.take());
        (self.running(link), r)
    }
}

/// Sends a running VM's state to a prepared destination at `to`, which expects `key`; once
/// the destination has it, the source stops itself. On failure the source keeps running.
pub fn send(
    vm: &mut dyn Vm,
    to: SocketAddr,
    params: &MigrationParams,
    key: Option<&MigrationKey>,
) -> Result<MigrationReport, MigrateError> {
    send_disks(vm, to, DiskMigration::Shared, params, key)
}

/// [`send`] with the disks as the destination announced ([`Incoming::disks`]): copied to its
/// export on `to`'s host first, or left in place.
pub fn send_disks(
    vm: &mut dyn Vm,
    to: SocketAddr,
    disks: DiskMigration,
    params: &MigrationParams,
    key: Option<&MigrationKey>,
) -> Result<MigrationReport, MigrateError> {
    let target = MigrationTarget {
        host: to.ip().to_string(),
        port: to.port(),
        key: key.cloned(),
        disks,
    };
    vm.migrate(&target, params).map_err(MigrateError::Send)
}

/// The destination's own overlay for a disk copy: `profile` with its one disk replaced by a
/// fresh overlay of the profile's (already local) base image.
fn own_overlay(profile: &Profile, prefix: &str) -> Result<(Profile, OverlayDir), MigrateError> {
    let base = profile.image.root_disk.clone().ok_or_else(|| {
        MigrateError::CannotCopy("the profile names no base image (image.root_disk)".into())
    })?;
    if profile.disks.len() != 1 || profile.disks[0].format != DiskFormat::Qcow2 {
        return Err(MigrateError::CannotCopy(format!(
            "{} disks; only a VM on one qcow2 overlay of its image can be copied",
            profile.disks.len()
        )));
    }
    let overlay = OverlayDir::create(prefix).map_err(MigrateError::Scratch)?;
    let path = overlay.path().join("root.qcow2");
    let qemu_img = v2m::which::find_binary(Path::new("qemu-img")).ok_or_else(|| {
        MigrateError::Overlay(V2mError::BinaryNotFound {
            binary: "qemu-img".into(),
            hint: "apt-get install qemu-utils".into(),
        })
    })?;
    let request = OverlayRequest {
        base,
        base_format: DiskFormat::Raw,
        path: path.clone(),
    };
    create_overlays(&qemu_img, &[request]).map_err(MigrateError::Overlay)?;
    let mut p = profile.clone();
    p.disks[0].path = path;
    Ok((p, overlay))
}
