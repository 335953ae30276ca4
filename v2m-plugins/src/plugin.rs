//! The V2M interface: a small, object-safe pair of traits. [`Plugin`] is one virtualization
//! solution on this host (probe, capabilities, translation, creating VMs); [`Vm`] is one VM's
//! handle and its life cycle. Anything a backend cannot do returns `V2mError::Unsupported`.

use crate::error::Result;
use crate::names::VmName;
use crate::profile::Profile;
use crate::state::{Operation, VmState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    Qemu,
    Libvirt,
    Xen,
    Palacios,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Qemu => "qemu",
            PluginKind::Libvirt => "libvirt",
            PluginKind::Xen => "xen",
            PluginKind::Palacios => "palacios",
        }
    }
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plugin name that is none of [`PluginKind`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown plugin {0:?}: expected qemu, libvirt, xen or palacios")]
pub struct UnknownPlugin(pub String);

impl vse_exit::Classify for UnknownPlugin {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

impl std::str::FromStr for PluginKind {
    type Err = UnknownPlugin;
    fn from_str(s: &str) -> Result<Self, UnknownPlugin> {
        match s {
            "qemu" => Ok(PluginKind::Qemu),
            "libvirt" => Ok(PluginKind::Libvirt),
            "xen" => Ok(PluginKind::Xen),
            "palacios" => Ok(PluginKind::Palacios),
            _ => Err(UnknownPlugin(s.to_string())),
        }
    }
}

/// What a probe found: usable here, or not and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum Availability {
    Available { detail: String },
    NotAvailable { reason: String },
}

impl Availability {
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available { .. })
    }
}

/// What a plugin can do in principle (before probing the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub operations: Vec<Operation>,
    /// Live migration that copies the disks' top layer to the destination's own overlays
    /// ([`DiskMigration::Copy`]); without it a migration needs shared storage.
    #[serde(default)]
    pub disk_copy: bool,
    /// e.g. "live migration only to another host (libvirt refuses same-host migration)".
    pub notes: Vec<String>,
}

impl Capabilities {
    pub fn supports(&self, op: Operation) -> bool {
        self.operations.contains(&op)
    }
}

/// The exact command line or configuration a plugin produces for a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub plugin: PluginKind,
    /// "argv", "domain-xml", "xl.cfg", "palacios-xml".
    pub format: String,
    /// The argv (for process-based plugins), else empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// Human-readable text: the shell-quoted command line, or the config file verbatim.
    pub text: String,
}

/// Where an incoming migration listens. Port 0 asks for any free port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationTarget {
    pub host: String,
    pub port: u16,
    /// With a key, the stream is TLS with this pre-shared key on both ends and the
    /// destination takes only a source that holds it; without, the raw stream is accepted
    /// from the first connection (keep such a listener on loopback). Never written to disk
    /// with the target.
    #[serde(skip)]
    pub key: Option<MigrationKey>,
    /// How the VM's disks get there.
    #[serde(default)]
    pub disks: DiskMigration,
}

/// How a live migration's disks reach the destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskMigration {
    /// Both ends open the same disk files (shared storage, or one machine).
    #[default]
    Shared,
    /// The destination runs on its own fresh overlays (over its own copy of the base image)
    /// and exports them over NBD on the target's host at `port` (0 when preparing: any free
    /// port), TLS with the migration's key; the source mirrors only its overlays' allocated
    /// clusters there before the memory moves.
    Copy { port: u16 },
}

impl DiskMigration {
    pub fn mode(self) -> StorageMode {
        match self {
            DiskMigration::Shared => StorageMode::Shared,
            DiskMigration::Copy { .. } => StorageMode::BlockCopy,
        }
    }
}

/// Which way a migration's disks went (the report's and the journal's word for it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StorageMode {
    #[default]
    Shared,
    BlockCopy,
}

impl StorageMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StorageMode::Shared => "shared",
            StorageMode::BlockCopy => "block-copy",
        }
    }
}

impl std::fmt::Display for StorageMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pre-shared key of one migration (32 bytes), known to both ends and nobody else.
#[derive(Clone, PartialEq, Eq)]
pub struct MigrationKey([u8; 32]);

impl MigrationKey {
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for MigrationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigrationKey(<secret>)")
    }
}

impl MigrationTarget {
    pub fn uri(&self) -> String {
        if self.host.contains(':') {
            format!("tcp:[{}]:{}", self.host, self.port)
        } else {
            format!("tcp:{}:{}", self.host, self.port)
        }
    }
}

/// Limits set explicitly on every migration (never left to hypervisor defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationParams {
    pub max_bandwidth_bytes_per_s: u64,
    pub downtime_limit_ms: u64,
    /// Give up (and cancel, leaving the source running) after this long.
    pub timeout: Duration,
}

impl Default for MigrationParams {
    fn default() -> Self {
        MigrationParams {
            max_bandwidth_bytes_per_s: 1 << 30,
            downtime_limit_ms: 300,
            timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationReport {
    pub total_time_ms: u64,
    pub downtime_ms: u64,
    /// Memory (RAM) bytes the migration stream carried.
    pub transferred_bytes: u64,
    /// Disk bytes the block mirror copied (0 with shared storage).
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub storage: StorageMode,
    pub setup_time_ms: u64,
    pub max_bandwidth_bytes_per_s: u64,
    pub downtime_limit_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub duration_ms: u64,
    /// The file's SHA-256 (hex), when the backend hashed it while writing it.
    #[serde(default)]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopOutcome {
    /// The guest powered off by itself within the grace period.
    Graceful,
    /// The hypervisor was told to quit (guest state discarded).
    Forced,
    /// The process had to be killed.
    Killed,
    /// It was not running any more.
    AlreadyGone,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuThread {
    pub index: u32,
    pub thread_id: i32,
    /// CPUs the thread may run on, as the host scheduler reports it now.
    pub affinity: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStatus {
    pub name: VmName,
    pub plugin: PluginKind,
    pub state: VmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// "kvm" or "tcg" for QEMU-based plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console_log: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_socket: Option<PathBuf>,
}

/// One virtualization solution on this host.
pub trait Plugin: Send + Sync {
    fn kind(&self) -> PluginKind;
    /// Checks the host (binaries, daemons, hypervisor) without changing anything.
    fn probe(&self) -> Availability;
    fn capabilities(&self) -> Capabilities;
    /// The exact command line or configuration `define` would use. Works without the hypervisor.
    fn explain(&self, profile: &Profile) -> Result<Explanation>;
    /// Creates the VM (state `defined`); nothing runs yet.
    fn define(&self, profile: &Profile) -> Result<Box<dyn Vm>>;
    /// Destination side of a live migration: a VM waiting for state at `listen`
    /// (state `migrating`; its [`Vm::incoming`] says the address actually bound). With
    /// `listen.disks` [`DiskMigration::Copy`] the profile's disks are fresh overlays the
    /// caller made, exported for the source's mirror (`Unsupported` without
    /// [`Capabilities::disk_copy`]).
    fn prepare_incoming(&self, profile: &Profile, listen: &MigrationTarget) -> Result<Box<dyn Vm>>;
    /// Starts a VM from a checkpoint file written by [`Vm::checkpoint`]; it runs afterwards.
    fn restore(&self, profile: &Profile, checkpoint: &Path) -> Result<Box<dyn Vm>> {
        let mut vm = self.restore_paused(profile, checkpoint)?;
        if vm.status()?.state == crate::state::VmState::Paused {
            vm.resume()?;
        }
        Ok(vm)
    }
    /// [`Plugin::restore`], left paused: the caller connects to the guest (its agent's
    /// channel) before the guest runs and writes to it.
    fn restore_paused(&self, profile: &Profile, checkpoint: &Path) -> Result<Box<dyn Vm>>;
    /// Reconnects to a VM started earlier (e.g. by another `vse vm` invocation).
    fn attach(&self, name: &VmName) -> Result<Box<dyn Vm>>;
}

/// One VM. Dropping a handle that owns its VM stops the VM (kill-on-drop), unless detached.
pub trait Vm: Send {
    fn name(&self) -> &VmName;
    fn status(&mut self) -> Result<VmStatus>;
    fn start(&mut self) -> Result<()>;
    /// Asks the guest to power off, waits up to `grace`, then forces it off.
    fn stop(&mut self, grace: Duration) -> Result<StopOutcome>;
    fn pause(&mut self) -> Result<()>;
    fn resume(&mut self) -> Result<()>;
    /// Source side: sends the VM to a destination prepared with [`Plugin::prepare_incoming`]
    /// and, once the destination has it, stops the source (perform + confirm). On failure the
    /// source keeps running. `target.disks` says whether the disks are mirrored first.
    fn migrate(
        &mut self,
        target: &MigrationTarget,
        params: &MigrationParams,
    ) -> Result<MigrationReport>;
    /// Destination side: the address it listens on (only for a prepared destination).
    fn incoming(&self) -> Option<&MigrationTarget>;
    /// Destination side: waits until the incoming state arrived and the VM runs.
    fn finish_incoming(&mut self, timeout: Duration) -> Result<()>;
    /// Writes the whole VM state to `path` (atomically); the VM is paused afterwards.
    fn checkpoint(&mut self, path: &Path) -> Result<CheckpointReport>;
    /// Everything the guest printed on its serial console so far.
    fn console_log(&self) -> Result<Vec<u8>>;
    fn vcpu_threads(&mut self) -> Result<Vec<VcpuThread>>;
    /// The host end of the guest agent channel (virtio-serial `org.vse.agent.0`).
    fn agent_socket(&self) -> Option<&Path>;
    /// The agent channel, connected by the plugin before a migration's or checkpoint's state
    /// loaded, once: the state can hold guest output the source's host end had not read, and
    /// the hypervisor flushes it the instant it loads; with no host end connected then, the
    /// port stays blocked for good (QEMU's virtio-serial). None: connect to
    /// [`Vm::agent_socket`].
    fn take_agent_channel(&mut self) -> Option<std::os::unix::net::UnixStream> {
        None
    }
    /// Lets the VM outlive this handle (the CLI starts VMs that later commands control).
    fn detach(self: Box<Self>);
}

/// Name of the virtio-serial port the guest agent listens on, in every plugin.
pub const AGENT_PORT_NAME: &str = "org.vse.agent.0";
