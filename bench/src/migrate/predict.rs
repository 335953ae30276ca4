//! The daemon's own prediction, on synthetic samples: in a fresh controller state the source
//! is an outlier above the threshold in a 4-node job, so the failure-avoidance rule plans a
//! move to the free node.

use crate::BenchError;
use control::migrate::{BarrierServer, Daemon, MigrationConfig};
use control::model::{Plan, Pool};
use control::state::StateDb;
use monitor::{JobId, MemInfo, NodeName, NodeSample, Sample, VmId};
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(super) fn id<T>(r: Result<T, monitor::IdError>) -> T {
    r.expect("literal identifiers are valid")
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

/// A predicted move of `vm` from `src` to `dst`, with the state and barrier server it runs
/// against and the instant the daemon returned the plan.
pub(super) struct Prediction {
    pub db: StateDb,
    pub server: BarrierServer,
    pub plan: Plan,
    pub at: Instant,
}

/// One prediction: a fresh controller state where `src` hosts the real VM and three other
/// (simulated) nodes of the job are healthy; `dst` is free.
pub(super) fn predict(
    dir: &Path,
    round: u32,
    vm: &VmId,
    src: &NodeName,
    dst: &NodeName,
    mem_max_kib: u64,
) -> Result<Prediction, BenchError> {
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
            return Ok(Prediction {
                db,
                server,
                plan,
                at: Instant::now(),
            });
        }
    }
    Err(BenchError::Failed(
        "the daemon never predicted the failure (20 rounds)".into(),
    ))
}
