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
mod checkpoint;
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

/// Where staged images live on a node (node-local; shared by this user's agents of one
/// machine, which is safe: images are published by atomic rename under their digest). One
/// directory per user: a cache must be private to whoever boots from it (`stage::prepare_cache`
/// refuses any other), so users must not share one.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("VSE_IMAGE_CACHE").map_or_else(
        || {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            format!("/var/tmp/vse-{uid}/images").into()
        },
        PathBuf::from,
    )
}

/// The pre-shared key of `vm`'s migration streams: HMAC-SHA256(job secret, label, VM), so
/// both nodes of a move derive it and it never travels; one per VM, so a key a QEMU held for
/// one VM opens no other VM's migration.
pub(crate) fn migration_key(secret: &agents::secret::JobSecret, vm: &str) -> v2m::MigrationKey {
    use hmac::{Hmac, Mac};
    let mut m =
        <Hmac<sha2::Sha256>>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    m.update(b"vse migration psk v1\0");
    m.update(vm.as_bytes());
    v2m::MigrationKey::new(m.finalize().into_bytes().into())
}

fn run_dir() -> PathBuf {
    vse_base::run_root()
}

/// V2M settings of this node's VMs (the same for VMs booted here and VMs migrated in).
fn settings() -> Settings {
    Settings {
        qemu: QemuConfig {
            run_root: run_dir(),
            accel: AccelPolicy::Auto,
            die_with_parent: true,
            ephemeral: true,
            hold_sigterm: true,
            ..QemuConfig::default()
        },
        libvirt: v2m::libvirt::LibvirtConfig {
            run_root: run_dir().join("libvirt"),
            ephemeral: true,
            ..Default::default()
        },
    }
}
