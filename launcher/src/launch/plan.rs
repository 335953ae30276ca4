//! Ranks and cores: VM i of node n is rank `sum(K) before n + i`; each VM gets `vcpus`
//! distinct host cores while the node has them, and only shares cores (round robin) when the
//! policy's `vms_per_core` allows that many vCPUs per core.

use crate::wire::VmOrder;
use agents::proto::NodeId;
use thiserror::Error;
use vse_exit::Exit;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error(
        "{host}: {vms} VM(s) x {vcpus} vCPU(s) need {need} vCPUs on {cpus} core(s), more than the policy's {per_core} vCPU(s) per core allow; hint: lower --vms-per-node or --vcpus, or ask for more cores"
    )]
    Oversubscribed {
        host: String,
        vms: u32,
        vcpus: u32,
        need: u32,
        cpus: u32,
        per_core: u32,
    },
    #[error("--vms-per-node and --vcpus must be at least 1")]
    Zero,
    #[error("cannot build the async runtime: {0}")]
    Runtime(String),
    #[error(
        "--spare-nodes {spare} leaves no node for the job's VMs out of {nodes}; hint: ask for more nodes or fewer spares"
    )]
    NoNodeLeft { nodes: u32, spare: u32 },
    #[error("monitoring: {0}")]
    Monitor(String),
    #[error("{0}")]
    Attach(String),
}

/// A launch refused before anything started is the request's fault, except a runtime that
/// cannot be built.
impl vse_exit::Classify for LaunchError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            LaunchError::Runtime(_) => vse_exit::ErrorKind::Internal,
            _ => vse_exit::ErrorKind::InvalidInput,
        }
    }
}

/// A node's share of the allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCpus {
    pub node: NodeId,
    pub host: String,
    pub cpus: u32,
    /// First core this node's VMs use: 0 on a real node; agents sharing one machine
    /// (`local:N`) start where the previous one stopped, so their VMs get distinct cores.
    pub first_core: u32,
    /// vCPUs other agents of the same machine already placed on these cores.
    pub shared_load: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmSlot {
    pub node: NodeId,
    pub order: VmOrder,
}

/// The VM name of a rank: also its entry in `VSE_HOSTS`.
pub fn vm_name(job: &str, rank: u32) -> String {
    format!("{job}-r{rank}")
}

pub fn plan_ranks(
    nodes: &[NodeCpus],
    vms_per_node: u32,
    vcpus: u32,
    vms_per_core: u32,
) -> Result<Vec<VmSlot>, LaunchError> {
    if vms_per_node == 0 || vcpus == 0 {
        return Err(LaunchError::Zero);
    }
    let per_core = vms_per_core.max(1);
    let mut out = Vec::new();
    let mut rank = 0;
    for n in nodes {
        let cpus = n.cpus.max(1);
        let need = vms_per_node * vcpus + n.shared_load;
        if need > cpus * per_core {
            return Err(LaunchError::Oversubscribed {
                host: n.host.clone(),
                vms: vms_per_node,
                vcpus,
                need,
                cpus,
                per_core,
            });
        }
        for i in 0..vms_per_node {
            let first = n.first_core + i * vcpus;
            let cores = (first..first + vcpus)
                .map(|c| (c % cpus) as usize)
                .collect::<Vec<_>>();
            out.push(VmSlot {
                node: n.node,
                order: VmOrder {
                    rank,
                    cpus: cores,
                    restore: None,
                },
            });
            rank += 1;
        }
    }
    Ok(out)
}

/// The job's exit code: the status of the lowest rank that failed, else 0. A status outside
/// 0..=255 (a rank that has none) maps to [`Exit::VmFailed`].
pub fn job_status(ranks: &[(u32, i32)]) -> u8 {
    let mut r: Vec<_> = ranks.to_vec();
    r.sort();
    r.iter().find(|(_, c)| *c != 0).map_or(0, |(_, c)| {
        u8::try_from(*c).unwrap_or(Exit::VmFailed.code())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u32, cpus: u32) -> NodeCpus {
        NodeCpus {
            node: NodeId(i),
            host: format!("n{i}"),
            cpus,
            first_core: 0,
            shared_load: 0,
        }
    }

    #[test]
    fn distinct_cores_then_policy_bound() {
        let p = plan_ranks(&[node(1, 4), node(2, 4)], 2, 2, 1).unwrap();
        let ranks: Vec<_> = p.iter().map(|s| (s.node.0, s.order.rank)).collect();
        assert_eq!(ranks, vec![(1, 0), (1, 1), (2, 2), (2, 3)]);
        assert_eq!(p[0].order.cpus, vec![0, 1]);
        assert_eq!(p[1].order.cpus, vec![2, 3]);
        let e = plan_ranks(&[node(1, 2)], 3, 1, 1).unwrap_err();
        assert!(
            matches!(e, LaunchError::Oversubscribed { need: 3, .. }),
            "{e}"
        );
        // Two vCPUs per core allowed: 3 VMs share 2 cores, round robin.
        let p = plan_ranks(&[node(1, 2)], 3, 1, 2).unwrap();
        let cores: Vec<_> = p.iter().map(|s| s.order.cpus[0]).collect();
        assert_eq!(cores, vec![0, 1, 0]);
        assert_eq!(plan_ranks(&[node(1, 2)], 0, 1, 1), Err(LaunchError::Zero));
        // Two agents on one 2-core machine: distinct cores, and a third VM is refused.
        let mut a = node(1, 2);
        let mut b = node(2, 2);
        b.first_core = 1;
        b.shared_load = 1;
        let p = plan_ranks(&[a.clone(), b.clone()], 1, 1, 1).unwrap();
        assert_eq!((p[0].order.cpus[0], p[1].order.cpus[0]), (0, 1));
        a.shared_load = 0;
        b.shared_load = 2;
        assert!(plan_ranks(&[a, b], 1, 1, 1).is_err());
    }

    #[test]
    fn first_failing_rank_decides() {
        assert_eq!(job_status(&[(1, 0), (0, 0)]), 0);
        assert_eq!(job_status(&[(2, 7), (1, 3), (0, 0)]), 3);
        assert_eq!(job_status(&[(0, -1)]), 103);
    }
}
