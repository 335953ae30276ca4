//! The rules: pure functions from the cluster view to "this node should shed these VMs now".
//! Persistence, destinations and guards are the daemon's business, so a new rule is small.

use super::config::{
    ConsolidationConfig, FailureAvoidanceConfig, OversubscriptionConfig, Persistence,
};
use super::stats::loo_outlier;
use crate::model::SourceFate;
use crate::model::{ClusterView, NodeView, Pool, VmView};
use monitor::{JobId, NodeName, VmId};
use std::collections::HashMap;

/// Where the VMs of a trigger may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// All to one free node if one can hold them, else spread over free nodes.
    FreeTogether,
    /// One free node per VM (speculative oversubscription).
    FreeSpread,
    /// Other nodes of the same job (consolidation).
    SameJob,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub node: NodeName,
    pub job: JobId,
    pub vms: Vec<VmId>,
    pub fate: SourceFate,
    pub destination: Destination,
    pub reason: String,
}

/// A migration rule. Implementations must be pure: the same view gives the same triggers.
pub trait Rule: Send {
    fn name(&self) -> &'static str;
    fn persistence(&self) -> Persistence;
    fn evaluate(&self, view: &ClusterView) -> Vec<Trigger>;
}

fn ratio(n: &NodeView) -> Option<f64> {
    n.mem.map(|m| m.active_ratio())
}

fn movable(by_node: &HashMap<&NodeName, Vec<&VmView>>, node: &NodeName) -> Vec<VmId> {
    by_node
        .get(node)
        .into_iter()
        .flatten()
        .filter(|v| !v.migrating)
        .map(|v| v.vm.clone())
        .collect()
}

/// Seed 002 §4.1: Active above a threshold AND a leave-one-out outlier in the job's group.
pub struct FailureAvoidance(pub FailureAvoidanceConfig);

impl Rule for FailureAvoidance {
    fn name(&self) -> &'static str {
        "failure-avoidance"
    }
    fn persistence(&self) -> Persistence {
        self.0.persistence
    }
    fn evaluate(&self, view: &ClusterView) -> Vec<Trigger> {
        let c = &self.0;
        let mut out = Vec::new();
        let by_node = view.vms_by_node();
        for (job, nodes) in view.groups() {
            let job = job.clone();
            let group: Vec<(&NodeView, f64)> = nodes
                .into_iter()
                .filter(|n| n.pool == Pool::Allocated)
                .filter_map(|n| ratio(n).map(|r| (n, r)))
                .collect();
            if group.len() < c.min_group {
                continue;
            }
            let values: Vec<f64> = group.iter().map(|(_, r)| *r).collect();
            for (i, (node, r)) in group.iter().enumerate() {
                if *r > c.active_ratio && loo_outlier(&values, i, c.sigma, c.min_gap_ratio) {
                    let vms = movable(&by_node, &node.name);
                    if vms.is_empty() {
                        continue;
                    }
                    out.push(Trigger {
                        node: node.name.clone(),
                        job: job.clone(),
                        vms,
                        fate: SourceFate::Defunct,
                        destination: Destination::FreeTogether,
                        reason: format!(
                            "Active {:.0}% of MemTotal > {:.0}% and a >{}σ outlier among {} nodes of job {job}",
                            r * 100.0,
                            c.active_ratio * 100.0,
                            c.sigma,
                            group.len()
                        ),
                    });
                }
            }
        }
        out
    }
}

/// Seed 000 §VI-A: VMs start with more maximum memory than is free; when a node's Active
/// memory crosses the threshold its VMs are spread out, one stays.
pub struct SpeculativeOversubscription(pub OversubscriptionConfig);

impl Rule for SpeculativeOversubscription {
    fn name(&self) -> &'static str {
        "speculative-oversubscription"
    }
    fn persistence(&self) -> Persistence {
        self.0.persistence
    }
    fn evaluate(&self, view: &ClusterView) -> Vec<Trigger> {
        let mut out = Vec::new();
        let by_node = view.vms_by_node();
        for node in view.nodes.iter().filter(|n| n.pool == Pool::Allocated) {
            let Some(r) = ratio(node) else { continue };
            if r < self.0.active_ratio {
                continue;
            }
            let mut vms: Vec<&VmView> = by_node
                .get(&node.name)
                .into_iter()
                .flatten()
                .copied()
                .filter(|v| !v.migrating)
                .collect();
            if vms.len() < 2 {
                continue;
            }
            // The largest VM stays: moving it would cost the most.
            vms.sort_by(|a, b| b.mem_max_kib.cmp(&a.mem_max_kib).then(a.vm.cmp(&b.vm)));
            out.push(Trigger {
                node: node.name.clone(),
                job: vms[0].job.clone(),
                vms: vms[1..].iter().map(|v| v.vm.clone()).collect(),
                fate: SourceFate::Keep,
                destination: Destination::FreeSpread,
                reason: format!(
                    "Active {:.0}% of MemTotal >= {:.0}% with {} VMs on the node",
                    r * 100.0,
                    self.0.active_ratio * 100.0,
                    vms.len()
                ),
            });
        }
        out
    }
}

/// Packs the VMs of a job's least used node onto its other nodes (off by default).
pub struct Consolidation(pub ConsolidationConfig);

impl Rule for Consolidation {
    fn name(&self) -> &'static str {
        "consolidation"
    }
    fn persistence(&self) -> Persistence {
        self.0.persistence
    }
    fn evaluate(&self, view: &ClusterView) -> Vec<Trigger> {
        let mut out = Vec::new();
        let by_node = view.vms_by_node();
        for (job, nodes) in view.groups() {
            let job = job.clone();
            let group: Vec<(&NodeView, f64)> = nodes
                .into_iter()
                .filter(|n| n.pool == Pool::Allocated)
                .filter_map(|n| ratio(n).map(|r| (n, r)))
                .collect();
            if group.len() < 2 {
                continue;
            }
            let Some((node, r)) = group
                .iter()
                .filter(|(_, r)| *r < self.0.below_ratio)
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.name.cmp(&b.0.name)))
            else {
                continue;
            };
            let vms = movable(&by_node, &node.name);
            if vms.is_empty() {
                continue;
            }
            out.push(Trigger {
                node: node.name.clone(),
                job: job.clone(),
                vms,
                fate: SourceFate::Free,
                destination: Destination::SameJob,
                reason: format!(
                    "Active {:.0}% of MemTotal < {:.0}%: pack onto the job's other nodes",
                    r * 100.0,
                    self.0.below_ratio * 100.0
                ),
            });
        }
        out
    }
}
