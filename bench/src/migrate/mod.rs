//! `vse bench migrate`: time from a failure prediction to the completed barrier-coordinated
//! migration, next to the raw QEMU live-migration time of the same VM. Two "nodes" are two
//! V2M QEMU run directories on this machine; the guest is `.ci/migrate-guest.sh`'s (guest
//! agent as PID 1 and the `msgcheck` program, which reaches a barrier every few ms). The
//! prediction is the daemon's own: synthetic samples make the source an outlier above the
//! threshold in a 4-node job, and the clock starts when the daemon returns the plan.

mod predict;

use crate::error::Context;
use crate::fixtures::{EnvFile, default_env_file};
use crate::stats::mean;
use crate::{BenchError, Step};
use clap::Args;
use control::migrate::{BarrierConfig, DeadlineAction, LiveMigrator, Outcome, run_plan};
use launcher::fleet::{MigrationRecord, QemuFleet, vm_name};
use monitor::{NodeName, VmId};
use predict::{Prediction, id, predict};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt;
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

pub fn run(a: &MigrateBench, step: Step) -> Result<MigrateReport, BenchError> {
    if a.rounds == 0 || !(64..=4096).contains(&a.memory) {
        return Err(BenchError::Invalid(
            "--rounds must be at least 1 and --memory between 64 and 4096 MiB".into(),
        ));
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
    let profile = Profile::new(vm_name(&vm)?, 1, a.memory, img);
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
    Ok(MigrateReport {
        accel,
        memory: a.memory,
        rounds: a.rounds,
        raw,
        full,
    })
}

/// Two nodes, each a QEMU run directory under `dir`, with the accelerator chosen once.
fn fleet(nodes: &[NodeName], choice: &AccelChoice, dir: &Path) -> QemuFleet {
    let accel = match choice.accel {
        v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
        v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
    };
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: 10 << 30,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(300),
    };
    let mut fleet = QemuFleet::new(params, std::net::Ipv4Addr::LOCALHOST.into());
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

/// The report's series and means.
struct Figures {
    raw_qemu: Vec<f64>,
    raw_wall: Vec<f64>,
    downtime: Vec<f64>,
    full_total: Vec<f64>,
    full_qemu: Vec<f64>,
}

impl MigrateReport {
    fn figures(&self) -> Figures {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Figures {
            raw_qemu: self
                .raw
                .iter()
                .map(|r| r.report.total_time_ms as f64)
                .collect(),
            raw_wall: self.raw.iter().map(|r| r.wall_ms as f64).collect(),
            downtime: self
                .raw
                .iter()
                .map(|r| r.report.downtime_ms as f64)
                .collect(),
            full_total: self.full.iter().map(|(d, _)| ms(*d)).collect(),
            full_qemu: self
                .full
                .iter()
                .map(|(_, r)| r.report.total_time_ms as f64)
                .collect(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let f = self.figures();
        json!({
            "accelerator": self.accel.accel.as_str(),
            "accelerator_reason": self.accel.reason,
            "guest_memory_mib": self.memory,
            "rounds": self.rounds,
            "raw": {
                "qemu_total_ms": f.raw_qemu,
                "qemu_downtime_ms": f.downtime,
                "prepare_to_running_ms": f.raw_wall,
            },
            "prediction_to_completion": {
                "total_ms": f.full_total,
                "qemu_total_ms": f.full_qemu,
            },
            "mean": {
                "raw_qemu_ms": mean(&f.raw_qemu),
                "raw_prepare_to_running_ms": mean(&f.raw_wall),
                "prediction_to_completion_ms": mean(&f.full_total),
                "protocol_overhead_ms": mean(&f.full_total) - mean(&f.full_qemu),
            },
        })
    }
}

impl fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.figures();
        writeln!(
            f,
            "{} MiB guest, {} ({}), {} round(s) each",
            self.memory,
            self.accel.accel.as_str(),
            self.accel.reason,
            self.rounds
        )?;
        writeln!(
            f,
            "raw QEMU live migration: {:.0} ms mean (downtime {:.0} ms); with destination \
             start and switch-over {:.0} ms",
            mean(&g.raw_qemu),
            mean(&g.downtime),
            mean(&g.raw_wall)
        )?;
        writeln!(
            f,
            "prediction → completed barrier-coordinated migration: {:.0} ms mean \
             (QEMU part {:.0} ms, protocol + destination start {:.0} ms)",
            mean(&g.full_total),
            mean(&g.full_qemu),
            mean(&g.full_total) - mean(&g.full_qemu)
        )
    }
}
