//! Typed samples. Every sample carries its tags, so a consumer up the overlay never has to
//! guess which job, node or VM a number belongs to.

use super::{JobId, MemInfo, NodeName, VmId};
use serde::{Deserialize, Serialize};

/// A node-level sample: host `/proc/meminfo` and per-core utilisation since the last sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSample {
    /// Milliseconds since the Unix epoch.
    pub ts_ms: u64,
    pub job: Option<JobId>,
    pub node: NodeName,
    pub mem: MemInfo,
    /// Busy fraction per core in [0, 1]; empty on the very first sample (no delta yet).
    pub cpu: Vec<f64>,
}

/// The hypervisor process as the host sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    pub pid: u32,
    pub rss_kib: u64,
    /// Cumulative user+system CPU time of all the process's threads.
    pub cpu_seconds: f64,
    /// Cores' worth of CPU used since the previous sample (may exceed 1 with several vCPUs).
    pub cpu_cores: Option<f64>,
}

/// The guest as its own kernel sees it (from the guest agent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestView {
    pub mem: MemInfo,
    pub cpu: Vec<f64>,
}

/// A per-VM sample. Either view may be missing (process gone, agent not answering); the
/// sample still travels so the controller sees the gap rather than stale data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmSample {
    pub ts_ms: u64,
    pub job: Option<JobId>,
    pub node: NodeName,
    pub vm: VmId,
    pub host: Option<HostView>,
    pub guest: Option<GuestView>,
    /// Why a view is missing, for operators.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Sample {
    Node(NodeSample),
    Vm(VmSample),
}

impl Sample {
    pub fn node(&self) -> &NodeName {
        match self {
            Sample::Node(s) => &s.node,
            Sample::Vm(s) => &s.node,
        }
    }
    pub fn ts_ms(&self) -> u64 {
        match self {
            Sample::Node(s) => s.ts_ms,
            Sample::Vm(s) => s.ts_ms,
        }
    }
}
