//! Binomial graph over `0..size`: node `i` links to `i ± 2^j (mod size)`. Its connectivity is
//! about 2·log2(N), so up to that many agent failures never split the survivors. Routes: with
//! every agent alive, greedy power-of-two steps (at most log2(N) + 1 hops, no table); after a
//! failure, shortest paths over the links whose ends are still alive.

use crate::proto::NodeId;
use std::collections::{BTreeSet, HashSet, VecDeque};

/// ```
/// use agents::proto::NodeId;
/// use agents::topo::Bmg;
/// use std::collections::HashSet;
/// let g = Bmg::new(8);
/// // 0 ± 1, 2, 4 (mod 8).
/// let n: Vec<u32> = g.neighbours(NodeId(0)).iter().map(|n| n.0).collect();
/// assert_eq!(n, [1, 2, 4, 6, 7]);
/// // With node 1 dead, 0 still reaches 3 in two hops: through 2 (+1), 4 (-1) or 7 (+4).
/// let dead: HashSet<NodeId> = [NodeId(1)].into();
/// let r = g.routes(NodeId(0), &dead);
/// assert!(matches!(r.next_hop(NodeId(3)), Some(NodeId(2) | NodeId(4) | NodeId(7))));
/// assert_eq!(r.next_hop(NodeId(1)), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bmg {
    size: u32,
}

impl Bmg {
    pub fn new(size: u32) -> Self {
        Self { size: size.max(1) }
    }

    pub fn neighbours(&self, n: NodeId) -> Vec<NodeId> {
        let m = u64::from(self.size);
        let mut set = BTreeSet::new();
        let mut d = 1u64;
        while d < m {
            set.insert(((u64::from(n.0) + d) % m) as u32);
            set.insert(((u64::from(n.0) + m - d) % m) as u32);
            d <<= 1;
        }
        set.remove(&n.0);
        set.into_iter().map(NodeId).collect()
    }

    /// Links this node dials (the other half dials it): to higher ids, so each link is made once.
    pub fn dials(&self, n: NodeId) -> Vec<NodeId> {
        self.neighbours(n)
            .into_iter()
            .filter(|p| p.0 > n.0)
            .collect()
    }

    /// Next hops from `me` over live nodes. With none dead, by arithmetic (no table: an agent
    /// of a 10,000-agent job would otherwise build one of 10,000 entries by a search over the
    /// whole graph); otherwise shortest paths over the survivors.
    pub fn routes(&self, me: NodeId, dead: &HashSet<NodeId>) -> RoutingTable {
        if dead.is_empty() {
            return RoutingTable {
                me,
                size: self.size,
                next: None,
            };
        }
        let mut next = vec![None; self.size as usize];
        let mut seen = vec![false; self.size as usize];
        seen[me.0 as usize] = true;
        let mut q = VecDeque::new();
        let mut found = Vec::with_capacity(128);
        self.for_each_neighbour(me, |v| found.push(v));
        for &v in &found {
            if !seen[v as usize] && !dead.contains(&NodeId(v)) {
                seen[v as usize] = true;
                next[v as usize] = Some(NodeId(v));
                q.push_back(v);
            }
        }
        while let Some(u) = q.pop_front() {
            let via = next[u as usize];
            found.clear();
            self.for_each_neighbour(NodeId(u), |v| found.push(v));
            for &v in &found {
                if !seen[v as usize] && !dead.contains(&NodeId(v)) {
                    seen[v as usize] = true;
                    next[v as usize] = via;
                    q.push_back(v);
                }
            }
        }
        RoutingTable {
            me,
            size: self.size,
            next: Some(next),
        }
    }

    /// `n ± 2^j`, in the order `neighbours` would give them before sorting (may repeat).
    fn for_each_neighbour(&self, n: NodeId, mut f: impl FnMut(u32)) {
        let m = u64::from(self.size);
        let mut d = 1u64;
        while d < m {
            for v in [(u64::from(n.0) + d) % m, (u64::from(n.0) + m - d) % m] {
                if v != u64::from(n.0) {
                    f(v as u32);
                }
            }
            d <<= 1;
        }
    }
}

/// Next hop for every destination; `None` = unreachable (dead, or cut off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTable {
    me: NodeId,
    size: u32,
    /// None: every agent alive, hops by arithmetic.
    next: Option<Vec<Option<NodeId>>>,
}

impl RoutingTable {
    pub fn next_hop(&self, dst: NodeId) -> Option<NodeId> {
        if dst == self.me {
            return Some(dst);
        }
        match &self.next {
            Some(t) => t.get(dst.0 as usize).copied().flatten(),
            None if dst.0 < self.size => Some(self.greedy(dst)),
            None => None,
        }
    }

    /// The largest power-of-two step towards `dst`, the shorter way round: each hop leaves less
    /// than half the distance, so at most log2(N) + 1 hops.
    fn greedy(&self, dst: NodeId) -> NodeId {
        let m = u64::from(self.size);
        let (me, dst) = (u64::from(self.me.0), u64::from(dst.0));
        let fwd = (dst + m - me) % m;
        let back = m - fwd;
        let step = |d: u64| 1u64 << (63 - d.leading_zeros());
        let hop = if fwd <= back {
            (me + step(fwd)) % m
        } else {
            (me + m - step(back)) % m
        };
        NodeId(hop as u32)
    }

    pub fn reachable(&self) -> usize {
        match &self.next {
            Some(t) => t.iter().filter(|n| n.is_some()).count(),
            None => self.size as usize - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_are_symmetric() {
        let g = Bmg::new(13);
        for i in 0..13 {
            for nb in g.neighbours(NodeId(i)) {
                assert!(g.neighbours(nb).contains(&NodeId(i)), "{i} -> {nb}");
            }
        }
        assert_eq!(
            g.neighbours(NodeId(0)),
            [1, 2, 4, 5, 8, 9, 11, 12].map(NodeId)
        );
    }

    #[test]
    fn survives_failures_up_to_its_degree() {
        let g = Bmg::new(64);
        // kill all but one of node 5's neighbours and some more: still reachable from 0.
        let nbs = g.neighbours(NodeId(5));
        let mut dead: HashSet<_> = nbs[1..].iter().copied().collect();
        dead.remove(&NodeId(0));
        let rt = g.routes(NodeId(0), &dead);
        let hop = rt.next_hop(NodeId(5)).expect("still reachable");
        assert!(!dead.contains(&hop));
        assert_eq!(rt.reachable(), 63 - dead.len());
        // routes follow links only, never through the dead
        let mut at = NodeId(0);
        for _ in 0..64 {
            if at == NodeId(5) {
                break;
            }
            let nh = g.routes(at, &dead).next_hop(NodeId(5)).unwrap();
            assert!(g.neighbours(at).contains(&nh) && !dead.contains(&nh));
            at = nh;
        }
        assert_eq!(at, NodeId(5));
        // all neighbours dead: cut off, reported as unreachable rather than a wrong route
        let all: HashSet<_> = nbs.into_iter().collect();
        assert_eq!(g.routes(NodeId(5), &all).reachable(), 0);
    }

    #[test]
    fn greedy_routes_follow_links_to_every_agent_in_log_hops() {
        for m in [2u32, 3, 7, 64, 100, 257] {
            let g = Bmg::new(m);
            let none = HashSet::new();
            let tables: Vec<RoutingTable> = (0..m).map(|i| g.routes(NodeId(i), &none)).collect();
            let limit = 64 - u64::from(m).leading_zeros() + 1;
            for src in 0..m {
                assert_eq!(tables[src as usize].reachable(), m as usize - 1);
                for dst in 0..m {
                    let (mut at, mut hops) = (NodeId(src), 0);
                    while at != NodeId(dst) {
                        let nh = tables[at.0 as usize].next_hop(NodeId(dst)).unwrap();
                        assert!(g.neighbours(at).contains(&nh), "{at} -> {nh} in {m}");
                        at = nh;
                        hops += 1;
                        assert!(hops <= limit, "{src} -> {dst} in {m}: over {limit} hops");
                    }
                }
            }
            assert_eq!(tables[0].next_hop(NodeId(m)), None);
        }
    }

    #[test]
    fn tiny_graphs() {
        assert!(Bmg::new(1).neighbours(NodeId(0)).is_empty());
        assert_eq!(Bmg::new(2).neighbours(NodeId(0)), [NodeId(1)]);
        assert_eq!(Bmg::new(2).dials(NodeId(0)), [NodeId(1)]);
    }
}
