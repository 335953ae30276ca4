//! One picture of the controller's state, as the page and `/api/status` show it: nodes with
//! their Active-memory ratio (the failure rule's input) and recent history, VMs, pools and
//! migrations. The state DB keeps only the latest sample per node, so the history is what
//! this server has seen since it started.

use crate::StatusError;
use control::state::{MigrationRecord, StateDb};
use monitor::Sample;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Points of history kept per node (a sparkline's width).
pub const HISTORY: usize = 120;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeState {
    pub name: String,
    /// free, allocated or defunct.
    pub pool: String,
    /// Active / MemTotal of the latest sample; `None` before the first one.
    pub ratio: Option<f64>,
    pub active_kib: Option<u64>,
    pub total_kib: Option<u64>,
    pub available_kib: Option<u64>,
    /// Mean busy fraction of the node's cores.
    pub cpu: Option<f64>,
    pub sample_ms: Option<u64>,
    pub vms: Vec<String>,
    /// Recent samples, oldest first: `[time ms, ratio]`.
    pub history: Vec<(u64, f64)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VmState {
    pub vm: String,
    pub job: String,
    pub node: String,
    pub mem_max_kib: u64,
    pub host_rss_kib: Option<u64>,
    pub guest_active_kib: Option<u64>,
    pub guest_total_kib: Option<u64>,
    pub last_migrated_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MoveState {
    pub vm: String,
    pub dest: String,
    pub moved: bool,
    /// What the move carried (storage mode, disk and memory bytes, downtime), once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer: Option<control::state::Transfer>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MigrationState {
    pub id: i64,
    pub job: String,
    pub rule: String,
    pub reason: String,
    pub state: String,
    pub source: String,
    pub source_fate: String,
    pub moves: Vec<MoveState>,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub note: String,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Snapshot {
    pub nodes: Vec<NodeState>,
    pub vms: Vec<VmState>,
    /// Node names per pool.
    pub pools: BTreeMap<String, Vec<String>>,
    /// Newest first.
    pub migrations: Vec<MigrationState>,
    pub jobs: Vec<String>,
}

/// Node histories across reads of the DB.
#[derive(Debug, Default)]
pub struct History(BTreeMap<String, VecDeque<(u64, f64)>>);

impl History {
    fn record(&mut self, node: &str, ts: u64, ratio: f64) -> Vec<(u64, f64)> {
        let h = self.0.entry(node.to_string()).or_default();
        if h.back().is_none_or(|(t, _)| *t < ts) {
            h.push_back((ts, ratio));
            while h.len() > HISTORY {
                h.pop_front();
            }
        }
        h.iter().copied().collect()
    }
}

fn migration(m: MigrationRecord) -> MigrationState {
    MigrationState {
        id: m.id.0,
        job: m.job.to_string(),
        rule: m.rule,
        reason: m.reason,
        state: m.state.as_str().into(),
        source: m.source.to_string(),
        source_fate: m.source_fate.as_str().into(),
        moves: m
            .moves
            .into_iter()
            .map(|mv| MoveState {
                vm: mv.vm.to_string(),
                dest: mv.dest.to_string(),
                moved: mv.moved,
                transfer: mv.transfer,
            })
            .collect(),
        created_ms: m.created_ms,
        updated_ms: m.updated_ms,
        note: m.note,
    }
}

/// Reads the state DB; returns the snapshot and the latest samples (for `/metrics`).
pub fn read(db: &StateDb, history: &mut History) -> Result<(Snapshot, Vec<Sample>), StatusError> {
    let vms = db.vms(None)?;
    let samples: Vec<Sample> = db.latest_samples()?.into_iter().map(|s| s.sample).collect();
    let mut pools: BTreeMap<String, Vec<String>> = ["allocated", "free", "defunct"]
        .into_iter()
        .map(|p| (p.to_string(), Vec::new()))
        .collect();
    let mut nodes = Vec::new();
    for n in db.nodes()? {
        let name = n.name.to_string();
        pools
            .entry(n.pool.as_str().into())
            .or_default()
            .push(name.clone());
        let ns = samples.iter().find_map(|s| match s {
            Sample::Node(ns) if ns.node == n.name => Some(ns),
            _ => None,
        });
        let ratio = ns.map(|s| s.mem.active_ratio());
        let hist = match (ns, ratio) {
            (Some(s), Some(r)) => history.record(&name, s.ts_ms, r),
            _ => Vec::new(),
        };
        nodes.push(NodeState {
            pool: n.pool.as_str().into(),
            ratio,
            active_kib: ns.map(|s| s.mem.active_kib),
            total_kib: ns.map(|s| s.mem.total_kib),
            available_kib: ns.map(|s| s.mem.available_kib),
            cpu: ns
                .filter(|s| !s.cpu.is_empty())
                .map(|s| s.cpu.iter().sum::<f64>() / s.cpu.len() as f64),
            sample_ms: ns.map(|s| s.ts_ms),
            vms: vms
                .iter()
                .filter(|v| v.node == n.name)
                .map(|v| v.vm.to_string())
                .collect(),
            history: hist,
            name,
        });
    }
    let vm_states = vms
        .iter()
        .map(|v| {
            let s = samples.iter().find_map(|s| match s {
                Sample::Vm(vs) if vs.vm == v.vm => Some(vs),
                _ => None,
            });
            VmState {
                vm: v.vm.to_string(),
                job: v.job.to_string(),
                node: v.node.to_string(),
                mem_max_kib: v.mem_max_kib,
                host_rss_kib: s.and_then(|s| s.host.as_ref()).map(|h| h.rss_kib),
                guest_active_kib: s.and_then(|s| s.guest.as_ref()).map(|g| g.mem.active_kib),
                guest_total_kib: s.and_then(|s| s.guest.as_ref()).map(|g| g.mem.total_kib),
                last_migrated_ms: v.last_migrated_ms,
            }
        })
        .collect();
    let mut jobs: Vec<String> = vms.iter().map(|v| v.job.to_string()).collect();
    jobs.sort();
    jobs.dedup();
    let migrations = db
        .migrations(None, false)?
        .into_iter()
        .map(migration)
        .collect();
    Ok((
        Snapshot {
            nodes,
            vms: vm_states,
            pools,
            migrations,
            jobs,
        },
        samples,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_new_points_only_and_is_bounded() {
        let mut h = History::default();
        assert_eq!(h.record("n1", 10, 0.5), vec![(10, 0.5)]);
        assert_eq!(
            h.record("n1", 10, 0.6),
            vec![(10, 0.5)],
            "same sample again"
        );
        for t in 11..11 + HISTORY as u64 {
            h.record("n1", t, 0.1);
        }
        let v = h.record("n2", 1, 0.2);
        assert_eq!(v, vec![(1, 0.2)]);
        let n1 = h.record("n1", 5, 0.9);
        assert_eq!(n1.len(), HISTORY);
        assert_eq!(n1.last(), Some(&(10 + HISTORY as u64, 0.1)));
    }
}
