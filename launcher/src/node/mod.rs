//! The node side of a launch, run by every node agent (`vse agent`). One [`NodeService`] per
//! agent acts on the front-end's orders: it opens the staging listener, boots the rank VMs
//! from the staged image (one thread per VM drives V2M and the guest agent), streams each
//! rank's output and status back, samples the node and its VMs for the controller, relays
//! the guest ranks' barrier lines, and moves VMs to other nodes (and takes them in) when the
//! migration daemon says so.
//!
//! Everything the node knows about its VMs — the VMs, the ranks they run (which the sampler
//! watches and barrier lines reach), migrations waiting for the other node — lives in one
//! [`NodeState`] behind one lock, so that a VM is added or removed in one place.

mod agent;
mod error;
mod migrate_in;
mod migrate_out;
mod rank;
mod report;
mod service;
mod state;
mod watch;

pub use agent::run_node_agent;
pub use error::NodeError;
pub use service::NodeService;
pub use state::NodeState;
pub use watch::{NodeMonitor, WatchError};

use std::path::PathBuf;
use v2m::qemu::{AccelPolicy, QemuConfig};
use v2m::registry::Settings;

/// Where staged images live on a node (node-local; shared by agents of one machine, which is
/// safe: images are published by atomic rename under their digest).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("VSE_IMAGE_CACHE").map_or_else(|| "/var/tmp/vse/images".into(), PathBuf::from)
}

fn run_dir() -> PathBuf {
    std::env::var_os("VSE_RUN_DIR").map_or_else(|| "/run/vse/v2m".into(), PathBuf::from)
}

/// V2M settings of this node's VMs (the same for VMs booted here and VMs migrated in).
fn settings() -> Settings {
    Settings {
        qemu: QemuConfig {
            run_root: run_dir(),
            accel: AccelPolicy::Auto,
            die_with_parent: true,
            ephemeral: true,
            ..QemuConfig::default()
        },
        libvirt: v2m::libvirt::LibvirtConfig {
            run_root: run_dir().join("libvirt"),
            ephemeral: true,
            ..Default::default()
        },
    }
}
