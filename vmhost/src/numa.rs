//! The host NUMA node a VM's memory is bound to: the node of the cores its vCPUs are pinned to,
//! as the seed controller did with `numactl --cpunodebind=N --membind=N`. Memory on another
//! node than the cores that use it costs every access a trip over the interconnect.

use std::path::Path;
use v2m::CpuSet;

/// Where the kernel lists each node's cores and which nodes have memory.
const NODES: &str = "/sys/devices/system/node";

/// A host node: its number and its cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: u32,
    pub cpus: Vec<usize>,
}

/// This host's nodes that have memory (none on a kernel without NUMA support, which the
/// caller treats as "bind nothing").
pub fn host_nodes() -> Vec<Node> {
    nodes_under(Path::new(NODES))
}

fn nodes_under(dir: &Path) -> Vec<Node> {
    let with_memory = std::fs::read_to_string(dir.join("has_memory"))
        .ok()
        .and_then(|s| s.trim().parse::<CpuSet>().ok());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut nodes: Vec<Node> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let id: u32 = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
            let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            // A node without cores lists an empty line.
            let cpus = list
                .trim()
                .parse::<CpuSet>()
                .map_or(Vec::new(), |c| c.cpus().to_vec());
            Some(Node { id, cpus })
        })
        .filter(|n| {
            with_memory
                .as_ref()
                .is_none_or(|m| m.cpus().contains(&(n.id as usize)))
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// The one node holding every core of `cpus`, if there is one. Cores spread over several
/// nodes get no binding: any one node would be remote for some of them, and the kernel's
/// first-touch placement then puts each page near the vCPU that uses it.
pub fn node_of(cpus: &[usize], nodes: &[Node]) -> Option<u32> {
    let first = cpus.first()?;
    let node = nodes.iter().find(|n| n.cpus.contains(first))?;
    cpus.iter()
        .all(|c| node.cpus.contains(c))
        .then_some(node.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, cpus: &[usize]) -> Node {
        Node {
            id,
            cpus: cpus.to_vec(),
        }
    }

    #[test]
    fn cores_on_one_node_bind_to_it_and_spread_cores_bind_nowhere() {
        let nodes = [node(0, &[0, 1, 2, 3]), node(1, &[4, 5, 6, 7])];
        assert_eq!(node_of(&[0, 2], &nodes), Some(0));
        assert_eq!(node_of(&[5], &nodes), Some(1));
        assert_eq!(node_of(&[3, 4], &nodes), None);
        assert_eq!(node_of(&[9], &nodes), None);
        assert_eq!(node_of(&[], &nodes), None);
        assert_eq!(node_of(&[0], &[]), None);
    }

    #[test]
    fn sysfs_nodes_without_memory_are_left_out() {
        let d = tempfile::tempdir().unwrap();
        for (n, list) in [("node0", "0-1,4\n"), ("node1", "2-3\n"), ("node2", "\n")] {
            std::fs::create_dir(d.path().join(n)).unwrap();
            std::fs::write(d.path().join(n).join("cpulist"), list).unwrap();
        }
        std::fs::create_dir(d.path().join("power")).unwrap();
        std::fs::write(d.path().join("has_memory"), "0,2\n").unwrap();
        assert_eq!(
            nodes_under(d.path()),
            [node(0, &[0, 1, 4]), node(2, &[])],
            "node1 has no memory; node2 has memory but no cores"
        );
        std::fs::remove_file(d.path().join("has_memory")).unwrap();
        assert_eq!(nodes_under(d.path()).len(), 3);
        assert_eq!(nodes_under(&d.path().join("absent")), []);
    }
}
