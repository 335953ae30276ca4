//! vse's own migration without shared storage, as the node agents run it (vmhost's steps): the
//! destination boots on its own copy of the image (`on_local_image`), on a fresh overlay it
//! exports over NBD with TLS-PSK (`DestDisks::Copy`); the source mirrors its overlay's
//! allocated clusters there, migrates the memory (TLS-PSK too), and completes the mirror while
//! paused before the switch-over (`send_disks`). The guest first writes `data_mib` MiB of
//! random data to its disk, so every move carries that much disk.
//!
//! Every round moves the VM there with TLS, as vse does between nodes, and back without it
//! (vmhost's loopback-only plain stream and NBD export), as the by-hand `drive-mirror` runs:
//! the two rows show what TLS costs, and the plain one is like for like with the by-hand one.

use crate::BenchError;
use serde::Serialize;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use v2m::{MigrationKey, MigrationParams};
use vmhost::{BootOptions, DestDisks, Incoming, RunningVm, VmSpec};
use vse_image::ImageDir;

/// One of vse's migrations, as its `MigrationReport` (the journal's `transfer`) has it.
#[derive(Debug, Clone, Serialize)]
pub struct VseRecord {
    /// `block-copy` (the report's storage mode).
    pub storage: String,
    /// Destination prepared → destination running (wall), like `prepare_to_running_ms`.
    pub total_ms: u64,
    /// The report's `total_time_ms`: mirror and memory until the switch-over.
    pub send_ms: u64,
    /// QEMU's `downtime` (it includes completing the mirror while paused).
    pub downtime_ms: u64,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
}

/// The node-local moves: with TLS-PSK (vse's way between nodes) and without.
#[derive(Debug, Default)]
pub struct VseMoves {
    pub tls: Vec<VseRecord>,
    pub plain: Vec<VseRecord>,
}

/// The two nodes: each a run root and its own copy of the image.
pub(super) struct LocalNodes<'a> {
    pub images: [ImageDir; 2],
    pub run_roots: [PathBuf; 2],
    pub accel: AccelPolicy,
    pub memory: u64,
    pub params: &'a MigrationParams,
}

fn key() -> Result<MigrationKey, BenchError> {
    let mut k = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut k))
        .map_err(BenchError::io("reading /dev/urandom for the migration key"))?;
    Ok(MigrationKey::new(k))
}

/// `rounds` block-copy migrations of one guest back and forth between the two nodes: there
/// with TLS, back without.
pub(super) fn run(
    n: &LocalNodes<'_>,
    rounds: u32,
    data_mib: u64,
    step: crate::Step,
) -> Result<VseMoves, BenchError> {
    let plugins: Vec<QemuPlugin> = n
        .run_roots
        .iter()
        .map(|r| {
            QemuPlugin::new(QemuConfig {
                run_root: r.clone(),
                accel: n.accel,
                ephemeral: true,
                ..QemuConfig::default()
            })
        })
        .collect();
    step("booting the guest through vmhost on node A's image copy");
    let spec = VmSpec::new(&n.images[0], "bench-local".parse()?, 1, n.memory);
    let opts = BootOptions::new("bench-local", Duration::from_secs(300));
    let mut vm = vmhost::boot(&plugins[0], &spec, &opts)?;
    super::images::write_data(vm.link(), data_mib)?;
    let (mut at, mut out) = (0usize, VseMoves::default());
    for r in 0..rounds {
        for tls in [true, false] {
            step(&format!(
                "vse migration over node-local disks {}/{rounds}, {}",
                r + 1,
                if tls { "TLS-PSK" } else { "plain" }
            ));
            let to = 1 - at;
            let moved = move_once(n, &plugins[to], &n.images[to], &mut vm, tls)?;
            if tls { &mut out.tls } else { &mut out.plain }.push(moved);
            at = to;
        }
    }
    let _ = vm.stop(Duration::from_secs(5));
    Ok(out)
}

/// One move of `vm` to the node of `plugin`, whose own image copy is `image`; without `tls`,
/// memory and disks travel in the clear (loopback only).
fn move_once(
    n: &LocalNodes<'_>,
    plugin: &QemuPlugin,
    image: &ImageDir,
    vm: &mut RunningVm,
    tls: bool,
) -> Result<VseRecord, BenchError> {
    let started = Instant::now();
    let key = if tls { Some(key()?) } else { None };
    let profile = vmhost::on_local_image(vm.profile(), image);
    let listen = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let copy = DestDisks::Copy {
        scratch_prefix: "bench-local",
    };
    let incoming = Incoming::prepare_with(plugin, &profile, listen, None, key.as_ref(), copy)?;
    let report = vmhost::send_disks(
        vm.vm_mut(),
        incoming.addr(),
        incoming.disks(),
        n.params,
        key.as_ref(),
    )?;
    let arrived = incoming.finish(n.params.timeout)?;
    let (moved, linked) = arrived.reattach(vm.link().clone());
    // The source stopped itself after the handover; dropping it removes its overlay.
    drop(std::mem::replace(vm, moved));
    linked.map_err(|e| BenchError::Failed(format!("the guest agent did not follow: {e}")))?;
    Ok(VseRecord {
        storage: report.storage.as_str().to_string(),
        total_ms: started.elapsed().as_millis() as u64,
        send_ms: report.total_time_ms,
        downtime_ms: report.downtime_ms,
        disk_bytes: report.disk_bytes,
        memory_bytes: report.transferred_bytes,
    })
}
