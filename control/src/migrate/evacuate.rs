//! Evacuation: an admin or a script moves every VM of a job off a node on purpose (drain,
//! maintenance, a failure the rules cannot see). Unlike the daemon's rules there is no
//! persistence window and no cool-down — the request is the decision — but the same placement
//! guard holds: a destination is a free node that can hold the VM's whole memory maximum. The
//! plan is all or nothing: a node left half-evacuated is neither drained nor serving.

use crate::model::{ClusterView, Move, Plan, Pool, SourceFate};
use monitor::{JobId, NodeName, VmId};
use std::collections::HashMap;

/// The rule name evacuations are journalled under.
pub const EVACUATE_RULE: &str = "evacuate";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvacuateError {
    #[error("node {node} holds no VM of job {job}: nothing to move")]
    Empty { job: JobId, node: NodeName },
    #[error("VM {vm} on {node} is being migrated already; try again when it has settled")]
    Busy { vm: VmId, node: NodeName },
    #[error(
        "no spare node can take {vm} ({need_kib} KiB): free nodes {free}; hint: launch with \
         --spare-nodes N, or free a node first"
    )]
    NoSpare {
        vm: VmId,
        need_kib: u64,
        /// Each free node with its placeable memory, for the message.
        free: String,
    },
}

/// Every VM of `job` on `node` to free nodes, largest VM first, each to the free node it fits
/// most tightly (the rest stays free for later moves); the node ends defunct.
pub fn evacuation_plan(
    view: &ClusterView,
    job: &JobId,
    node: &NodeName,
) -> Result<Plan, EvacuateError> {
    let mut vms: Vec<_> = view.vms_on(node).filter(|v| &v.job == job).collect();
    if vms.is_empty() {
        return Err(EvacuateError::Empty {
            job: job.clone(),
            node: node.clone(),
        });
    }
    if let Some(v) = vms.iter().find(|v| v.migrating) {
        return Err(EvacuateError::Busy {
            vm: v.vm.clone(),
            node: node.clone(),
        });
    }
    vms.sort_by(|a, b| b.mem_max_kib.cmp(&a.mem_max_kib).then(a.vm.cmp(&b.vm)));
    let free: Vec<_> = view
        .nodes
        .iter()
        .filter(|n| n.pool == Pool::Free && &n.name != node)
        .collect();
    let mut reserved: HashMap<&NodeName, u64> = HashMap::new();
    let mut moves = Vec::new();
    for v in vms {
        let room =
            |n: &NodeName, kib: u64| kib.saturating_sub(reserved.get(n).copied().unwrap_or(0));
        let pick = free
            .iter()
            .map(|n| (n, room(&n.name, view.placeable_kib(n))))
            .filter(|(_, r)| *r >= v.mem_max_kib)
            .min_by_key(|(n, r)| (*r, n.name.clone()));
        let Some((dest, _)) = pick else {
            let free = if free.is_empty() {
                "none".to_string()
            } else {
                free.iter()
                    .map(|n| format!("{} ({} KiB)", n.name, room(&n.name, view.placeable_kib(n))))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(EvacuateError::NoSpare {
                vm: v.vm.clone(),
                need_kib: v.mem_max_kib,
                free,
            });
        };
        *reserved.entry(&dest.name).or_default() += v.mem_max_kib;
        moves.push(Move {
            vm: v.vm.clone(),
            dest: dest.name.clone(),
            mem_max_kib: v.mem_max_kib,
        });
    }
    Ok(Plan {
        rule: EVACUATE_RULE.to_string(),
        job: job.clone(),
        source: node.clone(),
        moves,
        source_fate: SourceFate::Defunct,
        reason: "evacuation requested (vse evacuate)".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NodeView, VmView};
    use monitor::MemInfo;

    fn node(name: &str, pool: Pool, avail_kib: u64) -> NodeView {
        NodeView {
            name: NodeName::new(name).unwrap(),
            pool,
            mem: Some(MemInfo {
                total_kib: 4 << 20,
                active_kib: 0,
                available_kib: avail_kib,
            }),
        }
    }

    fn vm(id: &str, on: &str, kib: u64) -> VmView {
        VmView {
            vm: VmId::new(id).unwrap(),
            job: JobId::new("j1").unwrap(),
            node: NodeName::new(on).unwrap(),
            mem_max_kib: kib,
            last_migrated_ms: Some(0),
            migrating: false,
        }
    }

    #[test]
    fn every_vm_moves_to_a_free_node_that_holds_it() {
        let view = ClusterView {
            now_ms: 1,
            nodes: vec![
                node("a", Pool::Allocated, 1 << 20),
                node("b", Pool::Allocated, 1 << 20),
                node("s1", Pool::Free, 600 << 10),
                node("s2", Pool::Free, 2 << 20),
            ],
            vms: vec![
                vm("j1-r0", "a", 512 << 10),
                vm("j1-r1", "a", 1 << 20),
                vm("j1-r2", "b", 1 << 20),
            ],
        };
        let job = JobId::new("j1").unwrap();
        let p = evacuation_plan(&view, &job, &NodeName::new("a").unwrap()).unwrap();
        let got: Vec<(String, String)> = p
            .moves
            .iter()
            .map(|m| (m.vm.to_string(), m.dest.to_string()))
            .collect();
        // The largest first, to the only node it fits; the small one then fits the tight one.
        assert_eq!(
            got,
            [
                ("j1-r1".to_string(), "s2".to_string()),
                ("j1-r0".into(), "s1".into())
            ]
        );
        assert_eq!(p.source_fate, SourceFate::Defunct);
        assert_eq!(p.rule, EVACUATE_RULE);
    }

    #[test]
    fn no_room_empty_node_and_busy_vm_are_refused() {
        let job = JobId::new("j1").unwrap();
        let a = NodeName::new("a").unwrap();
        let mut view = ClusterView {
            now_ms: 1,
            nodes: vec![
                node("a", Pool::Allocated, 1 << 20),
                node("s", Pool::Free, 100),
            ],
            vms: vec![vm("j1-r0", "a", 512 << 10)],
        };
        let e = evacuation_plan(&view, &job, &a).unwrap_err();
        assert!(matches!(e, EvacuateError::NoSpare { .. }), "{e}");
        assert!(e.to_string().contains("s (100 KiB)"), "{e}");
        view.vms[0].migrating = true;
        view.nodes[1] = node("s", Pool::Free, 1 << 20);
        assert!(matches!(
            evacuation_plan(&view, &job, &a),
            Err(EvacuateError::Busy { .. })
        ));
        let e = evacuation_plan(&view, &job, &NodeName::new("s").unwrap()).unwrap_err();
        assert!(matches!(e, EvacuateError::Empty { .. }));
    }
}
