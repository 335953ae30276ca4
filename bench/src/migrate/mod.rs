//! `vse bench migrate`: time from a failure prediction to the completed barrier-coordinated
//! migration, next to the raw QEMU live-migration time of the same VM. Two "nodes" are two
//! V2M QEMU run directories on this machine; the guest is `.ci/migrate-guest.sh`'s (guest
//! agent as PID 1 and the `msgcheck` program, which reaches a barrier every few ms). The
//! prediction is the daemon's own: synthetic samples make the source an outlier above the
//! threshold in a 4-node job, and the clock starts when the daemon returns the plan.
//!
//! The node-local storage case, measured in the same run on a guest with a disk (each node its
//! own copy of the image): the same guest on a plain QEMU command line migrated by hand over
//! QMP with a shared overlay and with `drive-mirror` to the destination's NBD export
//! (`raw.rs`), vse's own block-copy migration (`node_local.rs`), and optionally `vse evacuate`
//! of an MPI job on the namespace cluster (`evacuate.rs`).

mod evacuate;
mod images;
mod node_local;
mod predict;
mod qmp;
mod raw;
mod report;

pub use evacuate::Evacuation;
pub use node_local::{VseMoves, VseRecord};
pub use qmp::QmpError;
pub use raw::RawRecord;

use crate::error::Context;
use crate::fixtures::{EnvFile, default_env_file};
use crate::{BenchError, Step};
use clap::Args;
use control::migrate::{BarrierConfig, DeadlineAction, LiveMigrator, Outcome, run_plan};
use launcher::fleet::{MigrationRecord, QemuFleet, vm_name};
use monitor::{NodeName, VmId};
use predict::{Prediction, id, predict};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use v2m::qemu::{AccelChoice, AccelPolicy, QemuConfig};
use v2m::{ImageRef, MigrationParams, Profile};
use vse_guest_agent::{Barriers, LinkOptions};

#[derive(Debug, Args)]
pub struct MigrateBench {
    /// Migrations measured each way (raw, and prediction-to-completion).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    pub memory: u64,
    /// The guest's env file (default: $VSE_CACHE/fixtures/migrate.env from .ci/migrate-guest.sh).
    #[arg(long)]
    pub guest: Option<PathBuf>,
    /// Root disk of the node-local runs, in MiB (each node has its own copy).
    #[arg(long, default_value_t = 256)]
    pub disk: u64,
    /// MiB the guest has written to its disk before the node-local runs: what each of their
    /// migrations copies.
    #[arg(long, default_value_t = 64)]
    pub disk_data: u64,
    /// The MPI image for the `vse evacuate` section (tests/mpi_migrate.rs's: mpi-lammps.vse.yaml
    /// with mpicheck); without it the section is skipped.
    #[arg(long, value_name = "DIR")]
    pub mpi_image: Option<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub struct MigrateReport {
    pub accel: AccelChoice,
    pub memory: u64,
    pub rounds: u32,
    /// QEMU live migration alone (prepare, send, switch over), no protocol.
    pub raw: Vec<MigrationRecord>,
    /// Prediction → notice → ranks at a barrier → live migration → ack: the whole time and
    /// the migration's own record.
    pub full: Vec<(Duration, MigrationRecord)>,
    pub disk_mib: u64,
    pub disk_data_mib: u64,
    /// The plain QEMU guest with a disk, by hand over QMP: shared overlay, then drive-mirror.
    pub raw_shared: Vec<RawRecord>,
    pub raw_copy: Vec<RawRecord>,
    /// vse's block-copy migration of the same guest over node-local disks, with TLS-PSK
    /// (between nodes) and without (loopback; like for like with `raw_copy`).
    pub vse_copy: VseMoves,
    pub evacuation: Evacuation,
}

fn image(env_file: &Path) -> Result<ImageRef, BenchError> {
    let env = EnvFile::read(env_file).map_err(|e| {
        BenchError::Invalid(format!(
            "cannot read the guest env file {}: {e}; hint: run .ci/migrate-guest.sh",
            env_file.display()
        ))
    })?;
    Ok(ImageRef {
        kernel: env.get("VSE_MIGRATE_KERNEL")?.into(),
        initrd: Some(env.get("VSE_MIGRATE_INITRD")?.into()),
        root_disk: None,
        cmdline: env.get("VSE_MIGRATE_CMDLINE")?,
    })
}

/// Every section in one run; `vse` is the binary the evacuation section runs.
pub fn run(a: &MigrateBench, vse: &Path, step: Step) -> Result<MigrateReport, BenchError> {
    if a.rounds == 0 || !(64..=4096).contains(&a.memory) {
        return Err(BenchError::Invalid(
            "--rounds must be at least 1 and --memory between 64 and 4096 MiB".into(),
        ));
    }
    if !(16..=65536).contains(&a.disk) || a.disk_data > a.disk {
        return Err(BenchError::Invalid(
            "--disk must be between 16 and 65536 MiB and --disk-data at most --disk".into(),
        ));
    }
    if let Some(image) = &a.mpi_image {
        evacuate::check_image(image)?;
    }
    let env_file = a
        .guest
        .clone()
        .unwrap_or_else(|| default_env_file("migrate.env"));
    let img = image(&env_file)?;
    let qemu = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).ok_or_else(|| {
        BenchError::Failed("qemu-system-x86_64 not found (apt-get install qemu-system-x86)".into())
    })?;
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-migrate-")
        .tempdir_in("/tmp")?;
    let accel = v2m::qemu::accel::choose(AccelPolicy::Auto, &qemu, &img.kernel, tmp.path());
    let nodes = [id(NodeName::new("node-a")), id(NodeName::new("node-b"))];
    let vm = id(VmId::new("bench-vm"));
    let mut fleet = fleet(&nodes, &accel, tmp.path());
    let profile = Profile::new(vm_name(&vm)?, 1, a.memory, img.clone());
    step(&format!(
        "booting a {} MiB guest ({})",
        a.memory,
        accel.accel.as_str()
    ));
    let barriers = Barriers::Socket(tmp.path().join("barrier.sock"));
    let link = LinkOptions::new(Duration::from_secs(300)).barriers(barriers);
    fleet
        .start(vm.clone(), &nodes[0], profile, link)
        .context("booting the guest (is this the .ci/migrate-guest.sh guest?)")?;
    let mut at = 0usize;
    for r in 0..a.rounds {
        step(&format!("raw live migration {}/{}", r + 1, a.rounds));
        fleet.live_migrate(&vm, &nodes[at], &nodes[1 - at])?;
        at = 1 - at;
    }
    let raw: Vec<_> = fleet.records().to_vec();
    let mut full = Vec::new();
    for r in 0..a.rounds {
        step(&format!("prediction to completion {}/{}", r + 1, a.rounds));
        let (src, dst) = (nodes[at].clone(), nodes[1 - at].clone());
        let p = predict(tmp.path(), r, &vm, &src, &dst, a.memory * 1024)?;
        full.push(coordinated(&mut fleet, &vm, p)?);
        at = 1 - at;
    }
    fleet.shutdown(Duration::from_secs(5));
    drop(fleet);
    let local = node_local_runs(a, &img, &accel, tmp.path(), step)?;
    let evacuation = evacuate::run(vse, a.mpi_image.as_deref(), step)?;
    Ok(MigrateReport {
        accel,
        memory: a.memory,
        rounds: a.rounds,
        raw,
        full,
        disk_mib: a.disk,
        disk_data_mib: a.disk_data,
        raw_shared: local.0,
        raw_copy: local.1,
        vse_copy: local.2,
        evacuation,
    })
}

type LocalRuns = (Vec<RawRecord>, Vec<RawRecord>, VseMoves);

/// The guest with a disk on two nodes with their own image copies: by hand over QMP (shared
/// overlay, then drive-mirror), then vse's block copy.
fn node_local_runs(
    a: &MigrateBench,
    img: &ImageRef,
    accel: &AccelChoice,
    dir: &Path,
    step: Step,
) -> Result<LocalRuns, BenchError> {
    let node = |n: &str| dir.join(format!("local-{n}"));
    let images = [
        images::node_image(&node("a").join("image"), img, a.disk)?,
        images::node_image(&node("b").join("image"), img, a.disk)?,
    ];
    let params = params();
    let raw_nodes = [0, 1].map(|i| {
        let n = node(["a", "b"][i]);
        (n.join("raw"), images[i].root().to_path_buf())
    });
    let mut nodes = raw::RawNodes::new(img, accel.accel.as_str(), a.memory, raw_nodes, &params);
    let (shared, copy) = raw::run(&mut nodes, a.rounds, a.disk_data, step)?;
    let local = node_local::LocalNodes {
        images,
        run_roots: [node("a").join("run"), node("b").join("run")],
        accel: policy(accel),
        memory: a.memory,
        params: &params,
    };
    let vse = node_local::run(&local, a.rounds, a.disk_data, step)?;
    Ok((shared, copy, vse))
}

fn policy(choice: &AccelChoice) -> AccelPolicy {
    match choice.accel {
        v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
        v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
    }
}

/// Every migration's limits, vse's and the baseline's alike.
fn params() -> MigrationParams {
    MigrationParams {
        max_bandwidth_bytes_per_s: 10 << 30,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(300),
    }
}

/// Two nodes, each a QEMU run directory under `dir`, with the accelerator chosen once.
fn fleet(nodes: &[NodeName], choice: &AccelChoice, dir: &Path) -> QemuFleet {
    let accel = policy(choice);
    let mut fleet = QemuFleet::new(params(), std::net::Ipv4Addr::LOCALHOST.into());
    for n in nodes {
        fleet.add_node(
            n.clone(),
            QemuConfig {
                run_root: dir.join(n.as_str()),
                accel,
                ..QemuConfig::default()
            },
        );
    }
    fleet
}

/// The predicted move carried out with the barrier protocol while the guest's `msgcheck`
/// runs; the time counts from the prediction (or from the program's first barrier, if later).
fn coordinated(
    fleet: &mut QemuFleet,
    vm: &VmId,
    p: Prediction,
) -> Result<(Duration, MigrationRecord), BenchError> {
    let Prediction {
        mut db,
        server,
        plan,
        at,
    } = p;
    let env: BTreeMap<String, String> = [
        (
            "VSE_BARRIER_SOCKET",
            vse_guest_agent::protocol::GUEST_BARRIER_SOCKET,
        ),
        ("VSE_JOB_ID", "bench"),
        ("VSE_VM_ID", vm.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let app = fleet
        .link(vm)
        .ok_or_else(|| BenchError::Failed("link".into()))?
        .spawn(&["/bin/msgcheck", "100000", "5"], env);
    // The program is already running in a real job; only count from the prediction on.
    let ready = Instant::now();
    while !server.ranks(&plan.job).contains_key(vm) {
        if ready.elapsed() > Duration::from_secs(120) {
            return Err(BenchError::Failed(
                "msgcheck never reached a barrier through the guest agent".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let predicted = at.max(Instant::now());
    let barrier = BarrierConfig {
        deadline_s: 120,
        on_deadline: DeadlineAction::Cancel,
    };
    let out = run_plan(&mut db, &server, fleet, &plan, &barrier)?;
    let total = predicted.elapsed();
    if !matches!(out, Outcome::Completed { .. }) {
        return Err(BenchError::Failed(format!(
            "migration did not complete: {out:?}"
        )));
    }
    let rec = fleet
        .records()
        .last()
        .cloned()
        .ok_or_else(|| BenchError::Failed("no record".into()))?;
    drop(server); // the rank sees end-of-file and its program goes on
    drop(app);
    Ok((total, rec))
}
