//! vmhost: image → running VM, on one host.
//!
//! An [`ImageDir`](vse_image::ImageDir) and a [`VmSpec`] (name, vCPUs, memory, pinned host
//! cores, NIC) become a VM on its own copy-on-write overlay of the image's root disk, booted
//! through whichever V2M [`Plugin`](v2m::Plugin) the caller chose, with its hypervisor process
//! in the node's cgroup and its guest agent answering: a [`RunningVm`]. The same VM moves
//! between hosts with the steps of [`migrate`]. `vse run`, the node side of `vse launch`, the
//! migration daemon's fleet and the benchmarks all boot and move VMs through here.

pub mod boot;
pub mod files;
pub mod fit;
pub mod migrate;
pub mod numa;
pub mod process;
pub mod restore;
pub mod spec;
pub mod storage;
pub mod template;

pub use boot::{BootError, BootOptions, CONSOLE_LINES, OverlayDir, RunningVm, boot, boot_profile};
pub use migrate::{Arrived, DestDisks, Incoming, MigrateError, send, send_disks};
pub use process::{CgroupError, alive, enter_cgroup};
pub use restore::{OVERLAY_FILE, restore};
pub use spec::{ImageIdentity, Nic, SpecError, VmSpec, fold_cpus, host_cores};
pub use storage::{ProbeFile, StorageProbe, leave_probe, on_local_image};
pub use template::{BootKind, TemplateError, TemplateInputs, Templates};
