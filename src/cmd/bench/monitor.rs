//! `vse bench monitor`: (1) sampler CPU cost per sample on this machine's /proc, (2) controller
//! ingest rate into the SQLite state with simulated nodes, (3) rule evaluation time over the
//! whole view, and (4) latency from the sample that completes a failure prediction to the
//! start of the migration protocol (notice posted, destination acquired).

use crate::exit::Failure;
use anyhow::Result;
use clap::Args;
use control::migrate::{Daemon, MigrationConfig};
use control::model::Pool;
use control::state::StateDb;
use monitor::{
    JobId, MemInfo, NoGuest, NodeName, NodeSample, Sample, Sampler, SamplerConfig, VmId, VmProcess,
    read_process,
};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct MonitorBench {
    /// Sampling rounds for the sampler cost.
    #[arg(long, default_value_t = 2000)]
    samples: u32,
    /// Simulated nodes for ingest and rule evaluation (4 nodes, one VM each, per job).
    #[arg(long, default_value_t = 10_000)]
    nodes: u32,
    /// Sampling rounds of all simulated nodes to ingest.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

fn mem(ratio: f64) -> MemInfo {
    let total = 64 * 1024 * 1024;
    let active = (total as f64 * ratio) as u64;
    MemInfo {
        total_kib: total,
        active_kib: active,
        available_kib: total - active,
    }
}

fn node_name(i: u32) -> NodeName {
    NodeName::new(format!("n{i:05}")).expect("valid generated name")
}

fn round_samples(nodes: u32, round: u32, hog: Option<u32>) -> Vec<Sample> {
    (0..nodes)
        .map(|i| {
            // Deterministic jitter of ±2% around 50% Active: healthy but noisy.
            let jitter = (((i.wrapping_mul(2654435761) ^ round.wrapping_mul(40503)) % 400) as f64
                - 200.0)
                / 10_000.0;
            let ratio = if Some(i) == hog { 0.93 } else { 0.5 + jitter };
            Sample::Node(NodeSample {
                ts_ms: round as u64 * 1000,
                job: Some(JobId::new(format!("j{}", i / 4)).expect("valid")),
                node: node_name(i),
                mem: mem(ratio),
                cpu: vec![0.5; 2],
            })
        })
        .collect()
}

/// A scratch directory for the benchmark's database, removed on drop (also on error).
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new() -> Result<Self> {
        let p = std::env::temp_dir().join(format!("vse-bench-monitor-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(a: MonitorBench) -> Result<ExitCode> {
    if a.samples == 0 || a.rounds == 0 || a.nodes < 4 {
        return Err(Failure::invalid(
            "--samples and --rounds must be at least 1 and --nodes at least 4 (one job is 4 nodes)",
        )
        .into());
    }
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let step = |m: &str| {
        if let Some(b) = &bar {
            b.set_message(m.to_string());
        }
    };

    // (1) Sampler: one node sample plus one VM host view (this process) per round.
    step("sampler cost");
    let me = std::process::id();
    let proc_root = std::path::Path::new("/proc");
    let mut sampler = Sampler::new(SamplerConfig::new(NodeName::new("bench")?));
    let vms = [VmProcess {
        vm: VmId::new("self")?,
        pid: me,
    }];
    let cpu0 = read_process(proc_root, me)?.cpu_ticks;
    let t0 = Instant::now();
    for _ in 0..a.samples {
        sampler.sample_all(&vms, &mut NoGuest)?;
    }
    let wall = t0.elapsed();
    let ticks = read_process(proc_root, me)?.cpu_ticks - cpu0;
    let tck = 100.0; // USER_HZ on Linux x86-64
    let cpu_us_per_sample = ticks as f64 / tck * 1e6 / a.samples as f64;
    let wall_us_per_sample = wall.as_secs_f64() * 1e6 / a.samples as f64;
    // At the default 1 s period, this is the fraction of one core the sampler takes.
    let overhead_pct = cpu_us_per_sample / 1e6 * 100.0;

    // (2) Ingest: every simulated node reports once per round.
    step("controller ingest");
    let dir = ScratchDir::new()?;
    let mut db = StateDb::open(&dir.0.join("state.db"))?;
    for i in 0..a.nodes {
        db.upsert_node(&node_name(i), Pool::Free)?;
    }
    for i in 0..a.nodes {
        db.add_vm(
            &JobId::new(format!("j{}", i / 4))?,
            &VmId::new(format!("vm{i:05}"))?,
            &node_name(i),
            4 << 20,
        )?;
    }
    let spare = a.nodes.div_ceil(100);
    for i in a.nodes..a.nodes + spare {
        db.upsert_node(&node_name(i), Pool::Free)?;
    }
    let rounds: Vec<Vec<Sample>> = (0..a.rounds)
        .map(|r| round_samples(a.nodes + spare, r, None))
        .collect();
    let t0 = Instant::now();
    for r in &rounds {
        db.record_samples(r)?;
    }
    let ingest = t0.elapsed();
    let ingest_rate = (rounds.len() * rounds[0].len()) as f64 / ingest.as_secs_f64();

    // (3) Rule evaluation over the whole view.
    step("rule evaluation");
    let mut daemon = Daemon::new(MigrationConfig::default())?;
    let t0 = Instant::now();
    let view = db.cluster_view(0)?;
    let view_time = t0.elapsed();
    let t0 = Instant::now();
    let evals = 5;
    for _ in 0..evals {
        let plans = daemon.evaluate(&view);
        anyhow::ensure!(
            plans.is_empty(),
            "healthy noisy nodes must not trigger: {plans:?}"
        );
    }
    let eval_time = t0.elapsed() / evals;

    // (4) Trigger latency: a hog on node 1; the persistence window needs k samples, the
    // latency is measured from the ingest of the k-th one to the posted notice.
    step("trigger latency");
    let k = MigrationConfig::default().failure_avoidance.persistence.k;
    let mut latency = None;
    for r in 0..10 {
        let samples = round_samples(a.nodes + spare, a.rounds + r, Some(1));
        let t0 = Instant::now();
        db.record_samples(&samples)?;
        let view = db.cluster_view((a.rounds + r) as u64 * 1000)?;
        let plans = daemon.evaluate(&view);
        if let Some(plan) = plans.first() {
            let id = db.plan_migration(plan)?;
            db.post_notice(id, 0)?;
            latency = Some((r + 1, t0.elapsed()));
            break;
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let (trigger_rounds, latency) =
        latency.ok_or_else(|| anyhow::anyhow!("the hog never triggered a plan"))?;

    let doc = json!({
        "sampler": {
            "samples": a.samples,
            "cpu_us_per_sample": cpu_us_per_sample,
            "wall_us_per_sample": wall_us_per_sample,
            "overhead_pct_of_one_core_at_1s": overhead_pct,
        },
        "ingest": {
            "nodes": a.nodes + spare,
            "samples": rounds.len() * rounds[0].len(),
            "samples_per_second": ingest_rate,
        },
        "rules": {
            "view_build_ms": view_time.as_secs_f64() * 1e3,
            "evaluate_ms": eval_time.as_secs_f64() * 1e3,
        },
        "trigger": {
            "persistence_k": k,
            "rounds_until_plan": trigger_rounds,
            "ingest_to_notice_ms": latency.as_secs_f64() * 1e3,
        },
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "sampler: {cpu_us_per_sample:.1} µs CPU ({wall_us_per_sample:.1} µs wall) per sample \
                  of node + 1 VM; {overhead_pct:.4}% of one core at a 1 s period"
        );
        println!(
            "controller ingest: {ingest_rate:.0} samples/s on one core ({} nodes × {} rounds)",
            a.nodes + spare,
            a.rounds
        );
        println!(
            "rules over {} nodes: view {:.1} ms, evaluation {:.1} ms per round",
            a.nodes + spare,
            view_time.as_secs_f64() * 1e3,
            eval_time.as_secs_f64() * 1e3
        );
        println!(
            "trigger: plan after {trigger_rounds} hog samples (persistence k = {k}); \
                  ingest of the triggering round → notice posted: {:.1} ms",
            latency.as_secs_f64() * 1e3
        );
    }
    Ok(ExitCode::SUCCESS)
}
