//! `vse bench monitor`: (1) sampler CPU cost per sample on this machine's /proc, (2) controller
//! ingest rate into the SQLite state with simulated nodes, (3) rule evaluation time over the
//! whole view, and (4) latency from the sample that completes a failure prediction to the
//! start of the migration protocol (notice posted, destination acquired).

use crate::{BenchError, Step};
use clap::Args;
use control::migrate::{Daemon, MigrationConfig};
use control::model::Pool;
use control::state::StateDb;
use monitor::{
    JobId, MemInfo, NoGuest, NodeName, NodeSample, Sample, Sampler, SamplerConfig, VmId, VmProcess,
    read_process,
};
use serde_json::json;
use std::fmt;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct MonitorBench {
    /// Sampling rounds for the sampler cost.
    #[arg(long, default_value_t = 2000)]
    pub samples: u32,
    /// Simulated nodes for ingest and rule evaluation (4 nodes, one VM each, per job).
    #[arg(long, default_value_t = 10_000)]
    pub nodes: u32,
    /// Sampling rounds of all simulated nodes to ingest.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct SamplerCost {
    pub cpu_us_per_sample: f64,
    pub wall_us_per_sample: f64,
    /// At the default 1 s period, the fraction of one core the sampler takes, %.
    pub overhead_pct: f64,
}

#[derive(Debug)]
pub struct MonitorReport {
    pub samples: u32,
    pub rounds: u32,
    pub sampler: SamplerCost,
    /// Simulated nodes, spares included.
    pub nodes: u32,
    pub ingested: usize,
    pub ingest_rate: f64,
    pub view_time: Duration,
    pub eval_time: Duration,
    pub persistence_k: u32,
    pub trigger_rounds: u32,
    pub latency: Duration,
}

impl MonitorReport {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "sampler": {
                "samples": self.samples,
                "cpu_us_per_sample": self.sampler.cpu_us_per_sample,
                "wall_us_per_sample": self.sampler.wall_us_per_sample,
                "overhead_pct_of_one_core_at_1s": self.sampler.overhead_pct,
            },
            "ingest": {
                "nodes": self.nodes,
                "samples": self.ingested,
                "samples_per_second": self.ingest_rate,
            },
            "rules": {
                "view_build_ms": self.view_time.as_secs_f64() * 1e3,
                "evaluate_ms": self.eval_time.as_secs_f64() * 1e3,
            },
            "trigger": {
                "persistence_k": self.persistence_k,
                "rounds_until_plan": self.trigger_rounds,
                "ingest_to_notice_ms": self.latency.as_secs_f64() * 1e3,
            },
        })
    }
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

/// Deterministic jitter of ±2% around 50% Active: healthy but noisy.
fn jitter(i: u32, round: u32) -> f64 {
    (((i.wrapping_mul(2654435761) ^ round.wrapping_mul(40503)) % 400) as f64 - 200.0) / 10_000.0
}

fn round_samples(nodes: u32, round: u32, hog: Option<u32>) -> Vec<Sample> {
    (0..nodes)
        .map(|i| {
            let ratio = if Some(i) == hog {
                0.93
            } else {
                0.5 + jitter(i, round)
            };
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

pub fn run(a: &MonitorBench, step: Step) -> Result<MonitorReport, BenchError> {
    if a.samples == 0 || a.rounds == 0 || a.nodes < 4 {
        return Err(BenchError::Invalid(
            "--samples and --rounds must be at least 1 and --nodes at least 4 (one job is 4 nodes)"
                .into(),
        ));
    }
    step("sampler cost");
    let sampler = sampler_cost(a.samples)?;
    step("controller ingest");
    let dir = tempfile::Builder::new()
        .prefix("vse-bench-monitor-")
        .tempdir()?;
    let mut db = StateDb::open(&dir.path().join("state.db"))?;
    let spare = a.nodes.div_ceil(100);
    let nodes = a.nodes + spare;
    let (ingested, ingest_time) = ingest(&mut db, a.nodes, spare, a.rounds)?;
    step("rule evaluation");
    let mut daemon = Daemon::new(MigrationConfig::default())?;
    let t0 = Instant::now();
    let view = db.cluster_view(0)?;
    let view_time = t0.elapsed();
    let t0 = Instant::now();
    let evals = 5;
    for _ in 0..evals {
        let plans = daemon.evaluate(&view);
        if !plans.is_empty() {
            return Err(BenchError::Failed(format!(
                "healthy noisy nodes must not trigger: {plans:?}"
            )));
        }
    }
    let eval_time = t0.elapsed() / evals;
    step("trigger latency");
    let (trigger_rounds, latency) = trigger(&mut db, &mut daemon, nodes, a.rounds)?;
    Ok(MonitorReport {
        samples: a.samples,
        rounds: a.rounds,
        sampler,
        nodes,
        ingested,
        ingest_rate: ingested as f64 / ingest_time.as_secs_f64(),
        view_time,
        eval_time,
        persistence_k: MigrationConfig::default().failure_avoidance.persistence.k,
        trigger_rounds,
        latency,
    })
}

/// (1) One node sample plus one VM host view (this process) per round.
fn sampler_cost(samples: u32) -> Result<SamplerCost, BenchError> {
    let me = std::process::id();
    let proc_root = std::path::Path::new("/proc");
    let mut sampler = Sampler::new(SamplerConfig::new(NodeName::new("bench")?));
    let vms = [VmProcess {
        vm: VmId::new("self")?,
        pid: me,
    }];
    let cpu0 = read_process(proc_root, me)?.cpu_ticks;
    let t0 = Instant::now();
    for _ in 0..samples {
        sampler.sample_all(&vms, &mut NoGuest)?;
    }
    let wall = t0.elapsed();
    let ticks = read_process(proc_root, me)?.cpu_ticks - cpu0;
    let tck = 100.0; // USER_HZ on Linux x86-64
    let cpu_us_per_sample = ticks as f64 / tck * 1e6 / samples as f64;
    Ok(SamplerCost {
        cpu_us_per_sample,
        wall_us_per_sample: wall.as_secs_f64() * 1e6 / samples as f64,
        overhead_pct: cpu_us_per_sample / 1e6 * 100.0,
    })
}

/// (2) Every simulated node (and `spare` free ones) reports once per round; returns the
/// samples ingested and the time it took.
fn ingest(
    db: &mut StateDb,
    nodes: u32,
    spare: u32,
    rounds: u32,
) -> Result<(usize, Duration), BenchError> {
    for i in 0..nodes {
        db.upsert_node(&node_name(i), Pool::Free)?;
    }
    for i in 0..nodes {
        db.add_vm(
            &JobId::new(format!("j{}", i / 4))?,
            &VmId::new(format!("vm{i:05}"))?,
            &node_name(i),
            4 << 20,
        )?;
    }
    for i in nodes..nodes + spare {
        db.upsert_node(&node_name(i), Pool::Free)?;
    }
    let batches: Vec<Vec<Sample>> = (0..rounds)
        .map(|r| round_samples(nodes + spare, r, None))
        .collect();
    let t0 = Instant::now();
    for r in &batches {
        db.record_samples(r)?;
    }
    Ok((batches.len() * batches[0].len(), t0.elapsed()))
}

/// (4) A hog on node 1; the persistence window needs k samples, the latency is measured from
/// the ingest of the k-th one to the posted notice.
fn trigger(
    db: &mut StateDb,
    daemon: &mut Daemon,
    nodes: u32,
    rounds: u32,
) -> Result<(u32, Duration), BenchError> {
    for r in 0..10 {
        let samples = round_samples(nodes, rounds + r, Some(1));
        let t0 = Instant::now();
        db.record_samples(&samples)?;
        let view = db.cluster_view((rounds + r) as u64 * 1000)?;
        let plans = daemon.evaluate(&view);
        if let Some(plan) = plans.first() {
            let id = db.plan_migration(plan)?;
            db.post_notice(id, 0)?;
            return Ok((r + 1, t0.elapsed()));
        }
    }
    Err(BenchError::Failed("the hog never triggered a plan".into()))
}

impl fmt::Display for MonitorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.sampler;
        writeln!(
            f,
            "sampler: {:.1} µs CPU ({:.1} µs wall) per sample of node + 1 VM; {:.4}% of one core at a 1 s period",
            s.cpu_us_per_sample, s.wall_us_per_sample, s.overhead_pct
        )?;
        writeln!(
            f,
            "controller ingest: {:.0} samples/s on one core ({} nodes × {} rounds)",
            self.ingest_rate, self.nodes, self.rounds
        )?;
        writeln!(
            f,
            "rules over {} nodes: view {:.1} ms, evaluation {:.1} ms per round",
            self.nodes,
            self.view_time.as_secs_f64() * 1e3,
            self.eval_time.as_secs_f64() * 1e3
        )?;
        writeln!(
            f,
            "trigger: plan after {} hog samples (persistence k = {}); ingest of the triggering round → notice posted: {:.1} ms",
            self.trigger_rounds,
            self.persistence_k,
            self.latency.as_secs_f64() * 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_nodes_are_noisy_but_healthy_and_the_hog_stands_out() {
        let samples = round_samples(400, 3, Some(1));
        let ratios: Vec<f64> = samples
            .iter()
            .map(|s| match s {
                Sample::Node(n) => n.mem.active_kib as f64 / n.mem.total_kib as f64,
                _ => unreachable!(),
            })
            .collect();
        assert!((ratios[1] - 0.93).abs() < 1e-6);
        for (i, r) in ratios.iter().enumerate().filter(|(i, _)| *i != 1) {
            assert!((0.479..=0.521).contains(r), "node {i}: {r}");
        }
        assert!(ratios.iter().any(|r| *r != ratios[0]), "no jitter");
    }
}
