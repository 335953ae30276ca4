//! The k-ary boot tree over agents `0..size` (0 = front-end). Node `i`'s children are
//! `k*i+1 ..= k*i+k`, so start-up takes one round per level: O(log_k N), not O(N).

use crate::proto::NodeId;
use std::collections::HashSet;

/// ```
/// use agents::proto::NodeId;
/// use agents::topo::Tree;
/// // The front-end and 12 node agents, 3 children each.
/// let t = Tree::new(13, 3);
/// assert_eq!(t.children(NodeId(0)), [NodeId(1), NodeId(2), NodeId(3)]);
/// assert_eq!(t.children(NodeId(2)), [NodeId(7), NodeId(8), NodeId(9)]);
/// assert_eq!(t.parent(NodeId(9)), Some(NodeId(2)));
/// assert_eq!(t.parent(NodeId(0)), None);
/// // Two rounds of start-up for 12 agents: 3 + 9.
/// assert_eq!(t.depth(), 2);
/// assert_eq!(t.subtree(NodeId(3)).len(), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tree {
    size: u32,
    k: u32,
}

impl Tree {
    /// `size` agents including the front-end; `k >= 1` children per agent.
    pub fn new(size: u32, k: u32) -> Self {
        Self {
            size: size.max(1),
            k: k.max(1),
        }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    pub fn k(&self) -> u32 {
        self.k
    }

    pub fn parent(&self, n: NodeId) -> Option<NodeId> {
        (n.0 > 0).then(|| NodeId((n.0 - 1) / self.k))
    }

    pub fn children(&self, n: NodeId) -> Vec<NodeId> {
        let first = u64::from(n.0) * u64::from(self.k) + 1;
        (first..first + u64::from(self.k))
            .take_while(|c| *c < u64::from(self.size))
            .map(|c| NodeId(c as u32))
            .collect()
    }

    /// Level of a node (front-end is 0).
    pub fn level(&self, mut n: NodeId) -> u32 {
        let mut d = 0;
        while let Some(p) = self.parent(n) {
            n = p;
            d += 1;
        }
        d
    }

    /// Number of levels below the front-end.
    pub fn depth(&self) -> u32 {
        self.level(NodeId(self.size - 1))
    }

    /// All nodes of `n`'s subtree, `n` included.
    pub fn subtree(&self, n: NodeId) -> Vec<NodeId> {
        let mut out = vec![n];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children(out[i]));
            i += 1;
        }
        out
    }

    /// The parent `n` reports to when some ancestors died: its nearest live ancestor.
    pub fn live_parent(&self, n: NodeId, dead: &HashSet<NodeId>) -> Option<NodeId> {
        let mut p = self.parent(n)?;
        while dead.contains(&p) {
            p = self.parent(p)?;
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let t = Tree::new(11, 3);
        assert_eq!(t.children(NodeId(0)), [NodeId(1), NodeId(2), NodeId(3)]);
        assert_eq!(t.children(NodeId(3)), [NodeId(10)]);
        assert_eq!(t.parent(NodeId(10)), Some(NodeId(3)));
        assert_eq!(t.depth(), 2);
        assert_eq!(
            t.subtree(NodeId(1)),
            [NodeId(1), NodeId(4), NodeId(5), NodeId(6)]
        );
        assert_eq!(Tree::new(10_001, 2).depth(), 13);
        // every node but the root has exactly one parent listing it as a child
        for i in 1..11 {
            let p = t.parent(NodeId(i)).unwrap();
            assert!(t.children(p).contains(&NodeId(i)));
        }
    }

    #[test]
    fn reparenting_skips_dead_ancestors() {
        let t = Tree::new(15, 2);
        let dead: HashSet<_> = [NodeId(1), NodeId(3)].into();
        assert_eq!(t.live_parent(NodeId(7), &dead), Some(NodeId(0)));
        assert_eq!(t.live_parent(NodeId(9), &dead), Some(NodeId(4)));
    }
}
