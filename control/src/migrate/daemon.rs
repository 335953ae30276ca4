//! The daemon: runs the rules every round, applies persistence (k of the last m rounds),
//! then picks destinations under the guards: per-VM cool-down, a destination must hold the
//! VM's whole maximum, and a cluster-wide limit on migrations in flight.

use super::config::{ConfigError, MigrationConfig};
use super::rules::{
    Consolidation, Destination, FailureAvoidance, Rule, SpeculativeOversubscription, Trigger,
};
use crate::model::{ClusterView, Move, NodeView, Plan, Pool, SourceFate};
use monitor::NodeName;
use std::collections::{HashMap, VecDeque};

pub struct Daemon {
    cfg: MigrationConfig,
    rules: Vec<Box<dyn Rule>>,
    rings: HashMap<(&'static str, NodeName), VecDeque<bool>>,
}

impl Daemon {
    /// The built-in rules enabled by `cfg`, after validating it.
    pub fn new(cfg: MigrationConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut rules: Vec<Box<dyn Rule>> = Vec::new();
        if cfg.failure_avoidance.enabled {
            rules.push(Box::new(FailureAvoidance(cfg.failure_avoidance.clone())));
        }
        if cfg.oversubscription.enabled {
            rules.push(Box::new(SpeculativeOversubscription(
                cfg.oversubscription.clone(),
            )));
        }
        if cfg.consolidation.enabled {
            rules.push(Box::new(Consolidation(cfg.consolidation.clone())));
        }
        Ok(Self::with_rules(cfg, rules))
    }

    /// Site-specific rules; guards still come from `cfg`.
    pub fn with_rules(cfg: MigrationConfig, rules: Vec<Box<dyn Rule>>) -> Self {
        Self {
            cfg,
            rules,
            rings: HashMap::new(),
        }
    }

    pub fn config(&self) -> &MigrationConfig {
        &self.cfg
    }

    /// One round. Call once per sampling period with the latest view.
    pub fn evaluate(&mut self, view: &ClusterView) -> Vec<Plan> {
        let mut fired: Vec<(&'static str, Trigger)> = Vec::new();
        for rule in &self.rules {
            let p = rule.persistence();
            let mut now: HashMap<NodeName, Trigger> = HashMap::new();
            for t in rule.evaluate(view) {
                now.entry(t.node.clone()).or_insert(t);
            }
            for node in view.nodes.iter().filter(|n| n.pool == Pool::Allocated) {
                let ring = self
                    .rings
                    .entry((rule.name(), node.name.clone()))
                    .or_default();
                ring.push_back(now.contains_key(&node.name));
                while ring.len() > p.m as usize {
                    ring.pop_front();
                }
                let hits = ring.iter().filter(|b| **b).count() as u32;
                if hits >= p.k
                    && let Some(t) = now.remove(&node.name)
                {
                    fired.push((rule.name(), t));
                }
            }
        }
        // A set, not view.node(): a linear lookup per ring is quadratic at 10,000 nodes.
        let allocated: std::collections::HashSet<&NodeName> = view
            .nodes
            .iter()
            .filter(|n| n.pool == Pool::Allocated)
            .map(|n| &n.name)
            .collect();
        self.rings.retain(|(_, n), _| allocated.contains(n));

        let mut budget = self
            .cfg
            .guards
            .max_concurrent
            .saturating_sub(view.vms.iter().filter(|v| v.migrating).count());
        let mut reserved: HashMap<NodeName, u64> = HashMap::new();
        let mut plans = Vec::new();
        for (rule, t) in fired {
            if budget == 0 {
                break;
            }
            if let Some(plan) = self.place(view, rule, &t, &mut reserved, &mut budget) {
                // A complete plan starts a fresh persistence window; a partial one (budget,
                // cool-down, no room) keeps it so the rest follows in later rounds.
                if plan.moves.len() == t.vms.len() {
                    self.rings.remove(&(rule, t.node.clone()));
                }
                plans.push(plan);
            }
        }
        plans
    }

    fn place(
        &self,
        view: &ClusterView,
        rule: &'static str,
        t: &Trigger,
        reserved: &mut HashMap<NodeName, u64>,
        budget: &mut usize,
    ) -> Option<Plan> {
        let cooldown_ms = self.cfg.guards.cooldown_s.saturating_mul(1000);
        let vms: Vec<_> = t
            .vms
            .iter()
            .filter_map(|id| view.vms.iter().find(|v| &v.vm == id))
            .filter(|v| !v.migrating)
            .filter(|v| {
                v.last_migrated_ms
                    .is_none_or(|at| view.now_ms.saturating_sub(at) >= cooldown_ms)
            })
            .collect();
        let room = |n: &NodeView, reserved: &HashMap<NodeName, u64>| {
            view.placeable_kib(n)
                .saturating_sub(reserved.get(&n.name).copied().unwrap_or(0))
        };
        let candidates: Vec<&NodeView> = match t.destination {
            Destination::FreeTogether | Destination::FreeSpread => view
                .nodes
                .iter()
                .filter(|n| n.pool == Pool::Free && n.name != t.node)
                .collect(),
            Destination::SameJob => view
                .job_nodes(&t.job)
                .into_iter()
                .filter(|n| n.pool == Pool::Allocated && n.name != t.node)
                .collect(),
        };
        let mut moves: Vec<Move> = Vec::new();
        if t.destination == Destination::FreeTogether {
            let total: u64 = vms.iter().map(|v| v.mem_max_kib).sum();
            // Prefer one node for all: the job's VMs keep sharing a host as before.
            if vms.len() <= *budget
                && let Some(dest) = candidates
                    .iter()
                    .filter(|n| room(n, reserved) >= total)
                    .min_by_key(|n| (room(n, reserved), n.name.clone()))
            {
                for v in &vms {
                    moves.push(Move {
                        vm: v.vm.clone(),
                        dest: dest.name.clone(),
                        mem_max_kib: v.mem_max_kib,
                    });
                }
                *reserved.entry(dest.name.clone()).or_default() += total;
                *budget -= moves.len();
            }
        }
        if moves.is_empty() {
            let mut order = vms.clone();
            order.sort_by(|a, b| b.mem_max_kib.cmp(&a.mem_max_kib).then(a.vm.cmp(&b.vm)));
            let mut used: Vec<NodeName> = Vec::new();
            for v in order {
                if *budget == 0 {
                    break;
                }
                let fits = |n: &&&NodeView| room(n, reserved) >= v.mem_max_kib;
                let spread = t.destination == Destination::FreeSpread;
                // Spreading prefers nodes not used yet this round; best fit otherwise.
                let pick = candidates
                    .iter()
                    .filter(fits)
                    .filter(|n| !spread || !used.contains(&n.name))
                    .min_by_key(|n| (room(n, reserved), n.name.clone()))
                    .or_else(|| {
                        candidates
                            .iter()
                            .filter(fits)
                            .min_by_key(|n| n.name.clone())
                    });
                let Some(dest) = pick else { continue };
                *reserved.entry(dest.name.clone()).or_default() += v.mem_max_kib;
                used.push(dest.name.clone());
                moves.push(Move {
                    vm: v.vm.clone(),
                    dest: dest.name.clone(),
                    mem_max_kib: v.mem_max_kib,
                });
                *budget -= 1;
            }
        }
        if moves.is_empty() {
            return None;
        }
        let complete = moves.len() == t.vms.len();
        Some(Plan {
            rule: rule.to_string(),
            job: t.job.clone(),
            source: t.node.clone(),
            source_fate: if complete { t.fate } else { SourceFate::Keep },
            moves,
            reason: t.reason.clone(),
        })
    }
}
