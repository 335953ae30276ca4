//! The control plane's shared vocabulary: what the rules see (the controller's placement plus
//! each node's latest memory sample) and what they decide (plans). The state DB and the
//! migration daemon both speak it; neither depends on the other for it.

use monitor::{JobId, MemInfo, NodeName, VmId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// Healthy and hosting nothing: a migration destination.
    Free,
    /// Hosting VMs of a job.
    Allocated,
    /// Predicted to fail or evacuated: never a destination.
    Defunct,
}

impl Pool {
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Free => "free",
            Pool::Allocated => "allocated",
            Pool::Defunct => "defunct",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "free" => Some(Pool::Free),
            "allocated" => Some(Pool::Allocated),
            "defunct" => Some(Pool::Defunct),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: NodeName,
    pub pool: Pool,
    /// Latest host sample; `None` until the node reported once.
    pub mem: Option<MemInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmView {
    pub vm: VmId,
    pub job: JobId,
    pub node: NodeName,
    /// The VM's memory maximum: a destination must hold all of it (seed 000 §V-D).
    pub mem_max_kib: u64,
    pub last_migrated_ms: Option<u64>,
    /// Part of a migration that has not finished.
    pub migrating: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterView {
    pub now_ms: u64,
    pub nodes: Vec<NodeView>,
    pub vms: Vec<VmView>,
}

impl ClusterView {
    pub fn node(&self, name: &NodeName) -> Option<&NodeView> {
        self.nodes.iter().find(|n| &n.name == name)
    }
    pub fn vms_on<'a>(&'a self, node: &'a NodeName) -> impl Iterator<Item = &'a VmView> + 'a {
        self.vms.iter().filter(move |v| &v.node == node)
    }
    /// Distinct jobs with VMs, in a stable order.
    pub fn jobs(&self) -> Vec<JobId> {
        let mut jobs: Vec<JobId> = self.vms.iter().map(|v| v.job.clone()).collect();
        jobs.sort();
        jobs.dedup();
        jobs
    }
    /// Nodes hosting VMs of `job`, sorted by name.
    pub fn job_nodes(&self, job: &JobId) -> Vec<&NodeView> {
        let mut names: Vec<&NodeName> = self
            .vms
            .iter()
            .filter(|v| &v.job == job)
            .map(|v| &v.node)
            .collect();
        names.sort();
        names.dedup();
        names.into_iter().filter_map(|n| self.node(n)).collect()
    }
    /// Each job's node group in one pass (rules run over 10,000-node views every period).
    pub fn groups(&self) -> BTreeMap<&JobId, Vec<&NodeView>> {
        let by_name: HashMap<&NodeName, &NodeView> =
            self.nodes.iter().map(|n| (&n.name, n)).collect();
        let mut names: BTreeMap<&JobId, Vec<&NodeName>> = BTreeMap::new();
        for v in &self.vms {
            names.entry(&v.job).or_default().push(&v.node);
        }
        names
            .into_iter()
            .map(|(job, mut ns)| {
                ns.sort();
                ns.dedup();
                (
                    job,
                    ns.into_iter()
                        .filter_map(|n| by_name.get(n).copied())
                        .collect(),
                )
            })
            .collect()
    }
    /// VMs per node in one pass.
    pub fn vms_by_node(&self) -> HashMap<&NodeName, Vec<&VmView>> {
        let mut out: HashMap<&NodeName, Vec<&VmView>> = HashMap::new();
        for v in &self.vms {
            out.entry(&v.node).or_default().push(v);
        }
        out
    }
    /// Memory a node can still promise to incoming VMs: what is available now, and never
    /// more than MemTotal minus the maxima of the VMs it already hosts.
    pub fn placeable_kib(&self, node: &NodeView) -> u64 {
        let Some(mem) = node.mem else { return 0 };
        let reserved: u64 = self.vms_on(&node.name).map(|v| v.mem_max_kib).sum();
        mem.available_kib
            .min(mem.total_kib.saturating_sub(reserved))
    }
}

/// What happens to the source node once the plan's migrations are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFate {
    /// Predicted to fail: to the defunct pool (seed 002 step 5).
    Defunct,
    /// Stays allocated (it keeps other VMs).
    Keep,
    /// Emptied by consolidation: back to the free pool.
    Free,
}

impl SourceFate {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFate::Defunct => "defunct",
            SourceFate::Keep => "keep",
            SourceFate::Free => "free",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "defunct" => Some(Self::Defunct),
            "keep" => Some(Self::Keep),
            "free" => Some(Self::Free),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub vm: VmId,
    pub dest: NodeName,
    pub mem_max_kib: u64,
}

/// One decision: move these VMs off `source`, then apply `source_fate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub rule: String,
    pub job: JobId,
    pub source: NodeName,
    pub moves: Vec<Move>,
    pub source_fate: SourceFate,
    pub reason: String,
}
