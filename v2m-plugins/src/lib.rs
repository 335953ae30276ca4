//! V2M: one small hypervisor interface ([`Plugin`], [`Vm`]) with a plugin per virtualization
//! solution (seed 003 §4). The launcher derives a [`Profile`] from the job and asks V2M; it never
//! talks to a hypervisor directly. Backends sit behind cargo features and are chosen at run time
//! by probing ([`registry`]).

pub mod affinity;
pub mod error;
pub mod names;
pub mod overlay;
pub mod plugin;
pub mod profile;
pub mod registry;
pub mod state;
pub mod which;

mod config_only;
#[cfg(feature = "libvirt")]
pub mod libvirt;
#[cfg(feature = "palacios")]
pub mod palacios;
#[cfg(feature = "xen")]
pub mod xen;

#[cfg(feature = "qemu")]
pub mod qemu;

pub use error::{Result, V2mError};
pub use names::{CpuSet, Hostname, MacAddr, VmName};
pub use plugin::{
    AGENT_PORT_NAME, Availability, Capabilities, CheckpointReport, DiskMigration, Explanation,
    MigrationKey, MigrationParams, MigrationReport, MigrationTarget, Plugin, PluginKind,
    StopOutcome, StorageMode, UnknownPlugin, VcpuThread, Vm, VmStatus,
};
pub use profile::{Console, Disk, DiskFormat, ImageRef, NetMode, Network, Profile};
pub use state::{Operation, VmState};
