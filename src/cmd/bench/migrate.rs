//! `vse bench migrate`: time from a failure prediction to the completed barrier-coordinated
//! migration, next to the raw QEMU live-migration time of the same VM. Two "nodes" are two
//! V2M QEMU run directories on this machine; the guest is `.ci/migrate-guest.sh`'s (guest
//! agent as PID 1 and the `msgcheck` program, which reaches a barrier every few ms). The
//! prediction is the daemon's own: synthetic samples make the source an outlier above the
//! threshold in a 4-node job, and the clock starts when the daemon returns the plan.

use crate::exit::Failure;
use anyhow::{Context, Result, bail};
use clap::Args;
use control::migrate::{
    BarrierConfig, BarrierServer, Daemon, DeadlineAction, LiveMigrator, MigrationConfig, Outcome,
    run_plan,
};
use control::model::Pool;
use control::state::StateDb;
use launcher::fleet::{QemuFleet, vm_name};
use monitor::{JobId, MemInfo, NodeName, NodeSample, Sample, VmId};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use v2m::qemu::{AccelPolicy, QemuConfig};
use v2m::{ImageRef, MigrationParams, Profile};
use vse_guest_agent::{Barriers, LinkOptions};

#[derive(Debug, Args)]
pub struct MigrateBench {
    /// Migrations measured each way (raw, and prediction-to-completion).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    memory: u64,
    /// The guest's env file (default: $VSE_CACHE/fixtures/migrate.env from .ci/migrate-guest.sh).
    #[arg(long)]
    guest: Option<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn id<T>(r: Result<T, monitor::IdError>) -> T {
    r.expect("literal identifiers are valid")
}

fn image(env_file: &Path) -> Result<ImageRef> {
    let text = std::fs::read_to_string(env_file).map_err(|e| {
        Failure::invalid(format!(
            "cannot read the guest env file {}: {e}; hint: run .ci/migrate-guest.sh",
            env_file.display()
        ))
    })?;
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(|v| v.trim_matches('"').to_string())
            .ok_or_else(|| Failure::invalid(format!("{}: no {k}= line", env_file.display())))
    };
    Ok(ImageRef {
        kernel: get("VSE_MIGRATE_KERNEL")?.into(),
        initrd: Some(get("VSE_MIGRATE_INITRD")?.into()),
        root_disk: None,
        cmdline: get("VSE_MIGRATE_CMDLINE")?,
    })
}

fn mem(ratio: f64) -> MemInfo {
    let total = 16 * 1024 * 1024;
    let active = (total as f64 * ratio) as u64;
    MemInfo {
        total_kib: total,
        active_kib: active,
        available_kib: total - active,
    }
}

/// One prediction: a fresh controller state where `src` hosts the real VM and three other
/// (simulated) nodes of the job are healthy; `dst` is free. Returns the plan and the state.
fn predict(
    dir: &Path,
    round: u32,
    vm: &VmId,
    src: &NodeName,
    dst: &NodeName,
    mem_max_kib: u64,
) -> Result<(StateDb, BarrierServer, control::model::Plan, Instant)> {
    let db_path = dir.join(format!("state-{round}.db"));
    let mut db = StateDb::open(&db_path)?;
    let job = id(JobId::new("bench"));
    let others: Vec<NodeName> = (1..=3)
        .map(|i| id(NodeName::new(format!("peer{i}"))))
        .collect();
    for n in others.iter().chain([src, dst]) {
        db.upsert_node(n, Pool::Free)?;
    }
    db.add_vm(&job, vm, src, mem_max_kib)?;
    for (i, n) in others.iter().enumerate() {
        db.add_vm(&job, &id(VmId::new(format!("peer-vm{i}"))), n, mem_max_kib)?;
    }
    let server = BarrierServer::bind(&dir.join("barrier.sock"))?;
    let mut cfg = MigrationConfig::default();
    cfg.guards.cooldown_s = 0;
    let mut daemon = Daemon::new(cfg)?;
    for r in 0..20u64 {
        let ts = now_ms();
        let mut batch = vec![Sample::Node(NodeSample {
            ts_ms: ts,
            job: Some(job.clone()),
            node: src.clone(),
            mem: mem(0.93),
            cpu: vec![],
        })];
        for (i, n) in others.iter().chain([dst]).enumerate() {
            batch.push(Sample::Node(NodeSample {
                ts_ms: ts,
                job: Some(job.clone()),
                node: n.clone(),
                mem: mem(0.40 + 0.01 * ((i as u64 + r) % 3) as f64),
                cpu: vec![],
            }));
        }
        db.record_samples(&batch)?;
        if let Some(plan) = daemon.evaluate(&db.cluster_view(ts)?).pop() {
            return Ok((db, server, plan, Instant::now()));
        }
    }
    bail!("the daemon never predicted the failure (20 rounds)")
}

pub fn run(a: MigrateBench) -> Result<ExitCode> {
    if a.rounds == 0 || !(64..=4096).contains(&a.memory) {
        return Err(Failure::invalid(
            "--rounds must be at least 1 and --memory between 64 and 4096 MiB",
        )
        .into());
    }
    let env_file = a.guest.clone().unwrap_or_else(|| {
        let cache = std::env::var("VSE_CACHE").unwrap_or_else(|_| "/var/cache/vse".into());
        Path::new(&cache).join("fixtures/migrate.env")
    });
    let img = image(&env_file)?;
    let qemu = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).ok_or_else(|| {
        anyhow::anyhow!("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
    })?;
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-migrate-")
        .tempdir_in("/tmp")?;
    let choice = v2m::qemu::accel::choose(AccelPolicy::Auto, &qemu, &img.kernel, tmp.path());
    let accel = match choice.accel {
        v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
        v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
    };
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let step = |m: String| {
        if let Some(b) = &bar {
            b.set_message(m);
        }
    };
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: 10 << 30,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(300),
    };
    let mut fleet = QemuFleet::new(params, std::net::Ipv4Addr::LOCALHOST.into());
    let nodes = [id(NodeName::new("node-a")), id(NodeName::new("node-b"))];
    for n in &nodes {
        fleet.add_node(
            n.clone(),
            QemuConfig {
                run_root: tmp.path().join(n.as_str()),
                accel,
                ..QemuConfig::default()
            },
        );
    }
    let vm = id(VmId::new("bench-vm"));
    let profile = Profile::new(vm_name(&vm)?, 1, a.memory, img);
    step(format!(
        "booting a {} MiB guest ({})",
        a.memory,
        choice.accel.as_str()
    ));
    let barriers = Barriers::Socket(tmp.path().join("barrier.sock"));
    let link = LinkOptions::new(Duration::from_secs(300)).barriers(barriers);
    fleet
        .start(vm.clone(), &nodes[0], profile, link)
        .context("booting the guest (is this the .ci/migrate-guest.sh guest?)")?;

    let mut at = 0usize;
    // Raw: QEMU live migration alone (prepare, send, switch over), no protocol.
    for r in 0..a.rounds {
        step(format!("raw live migration {}/{}", r + 1, a.rounds));
        fleet
            .live_migrate(&vm, &nodes[at], &nodes[1 - at])
            .map_err(anyhow::Error::msg)?;
        at = 1 - at;
    }
    let raw: Vec<_> = fleet.records().to_vec();
    // Full loop: prediction → notice → ranks at a barrier → live migration → ack.
    let mut full = Vec::new();
    let barrier = BarrierConfig {
        deadline_s: 120,
        on_deadline: DeadlineAction::Cancel,
    };
    for r in 0..a.rounds {
        step(format!("prediction to completion {}/{}", r + 1, a.rounds));
        let (src, dst) = (nodes[at].clone(), nodes[1 - at].clone());
        let (mut db, server, plan, predicted) =
            predict(tmp.path(), r, &vm, &src, &dst, a.memory * 1024)?;
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
            .link(&vm)
            .context("link")?
            .spawn(&["/bin/msgcheck", "100000", "5"], env);
        // The program is already running in a real job; only count from the prediction on.
        let ready = Instant::now();
        while !server.ranks(&plan.job).contains_key(&vm) {
            if ready.elapsed() > Duration::from_secs(120) {
                bail!("msgcheck never reached a barrier through the guest agent");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let predicted = predicted.max(Instant::now());
        let out = run_plan(&mut db, &server, &mut fleet, &plan, &barrier)?;
        let total = predicted.elapsed();
        if !matches!(out, Outcome::Completed { .. }) {
            bail!("migration did not complete: {out:?}");
        }
        let rec = fleet.records().last().cloned().context("no record")?;
        full.push((total, rec));
        drop(server); // the rank sees end-of-file and its program goes on
        drop(app);
        at = 1 - at;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    fleet.shutdown(Duration::from_secs(5));

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let raw_qemu: Vec<f64> = raw.iter().map(|r| r.report.total_time_ms as f64).collect();
    let raw_wall: Vec<f64> = raw.iter().map(|r| r.wall_ms as f64).collect();
    let downtime: Vec<f64> = raw.iter().map(|r| r.report.downtime_ms as f64).collect();
    let full_total: Vec<f64> = full.iter().map(|(d, _)| ms(*d)).collect();
    let full_qemu: Vec<f64> = full
        .iter()
        .map(|(_, r)| r.report.total_time_ms as f64)
        .collect();
    let doc = json!({
        "accelerator": choice.accel.as_str(),
        "accelerator_reason": choice.reason,
        "guest_memory_mib": a.memory,
        "rounds": a.rounds,
        "raw": {
            "qemu_total_ms": raw_qemu,
            "qemu_downtime_ms": downtime,
            "prepare_to_running_ms": raw_wall,
        },
        "prediction_to_completion": {
            "total_ms": full_total,
            "qemu_total_ms": full_qemu,
        },
        "mean": {
            "raw_qemu_ms": avg(&raw_qemu),
            "raw_prepare_to_running_ms": avg(&raw_wall),
            "prediction_to_completion_ms": avg(&full_total),
            "protocol_overhead_ms": avg(&full_total) - avg(&full_qemu),
        },
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{} MiB guest, {} ({}), {} round(s) each",
            a.memory,
            choice.accel.as_str(),
            choice.reason,
            a.rounds
        );
        println!(
            "raw QEMU live migration: {:.0} ms mean (downtime {:.0} ms); with destination \
             start and switch-over {:.0} ms",
            avg(&raw_qemu),
            avg(&downtime),
            avg(&raw_wall)
        );
        println!(
            "prediction → completed barrier-coordinated migration: {:.0} ms mean \
             (QEMU part {:.0} ms, protocol + destination start {:.0} ms)",
            avg(&full_total),
            avg(&full_qemu),
            avg(&full_total) - avg(&full_qemu)
        );
    }
    Ok(ExitCode::SUCCESS)
}
