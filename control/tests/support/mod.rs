//! What the coordinator tests share: names, and the plan that moves vm0 from n0 to f0.

use control::model::{Move, Plan, SourceFate};
use monitor::{JobId, NodeName, VmId};

pub fn nm(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}

pub fn vm(s: &str) -> VmId {
    VmId::new(s).unwrap()
}

/// Failure avoidance's plan for `job`: vm0 leaves n0 (then defunct) for f0.
pub fn plan(job: &JobId) -> Plan {
    Plan {
        rule: "test".into(),
        job: job.clone(),
        source: nm("n0"),
        moves: vec![Move {
            vm: vm("vm0"),
            dest: nm("f0"),
            mem_max_kib: 1024,
        }],
        source_fate: SourceFate::Defunct,
        reason: "test".into(),
    }
}
