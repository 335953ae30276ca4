//! The VM life cycle as a typed state machine:
//! `defined → running ⇄ paused → stopped`, plus `migrating` (an outgoing migration on the
//! source, or a prepared destination waiting for the incoming state).
//! Every plugin checks an operation against [`VmState::after`] before touching the hypervisor,
//! so an invalid request is a typed error and never reaches QEMU/libvirt half-done.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmState {
    Defined,
    Running,
    Paused,
    Migrating,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    Define,
    Start,
    Stop,
    Pause,
    Resume,
    /// Source side of a live migration (perform + confirm).
    Migrate,
    /// Destination side: wait for the incoming state and run.
    FinishIncoming,
    PrepareIncoming,
    Checkpoint,
    Restore,
    ConsoleLog,
    VcpuThreads,
}

impl VmState {
    /// The state an operation leads to from `self`, or `None` when it is not allowed.
    /// Migrate and checkpoint are reported by their final state (stopped, paused).
    pub fn after(self, op: Operation) -> Option<VmState> {
        use Operation as O;
        use VmState as S;
        match (op, self) {
            (O::Start, S::Defined) => Some(S::Running),
            (O::Pause, S::Running) => Some(S::Paused),
            (O::Resume, S::Paused) => Some(S::Running),
            (O::Stop, S::Defined | S::Running | S::Paused | S::Migrating) => Some(S::Stopped),
            (O::Migrate, S::Running | S::Paused) => Some(S::Stopped),
            (O::FinishIncoming, S::Migrating) => Some(S::Running),
            (O::Checkpoint, S::Running | S::Paused) => Some(S::Paused),
            (O::VcpuThreads, S::Running | S::Paused | S::Migrating) => Some(self),
            (O::ConsoleLog, _) => Some(self),
            _ => None,
        }
    }

    /// The states from which `op` is allowed, for error messages.
    pub fn allowed_from(op: Operation) -> Vec<VmState> {
        Self::ALL
            .into_iter()
            .filter(|s| s.after(op).is_some())
            .collect()
    }

    pub const ALL: [VmState; 5] = [
        VmState::Defined,
        VmState::Running,
        VmState::Paused,
        VmState::Migrating,
        VmState::Stopped,
    ];

    /// Checks a transition and builds the typed error when it is invalid.
    pub fn check(self, vm: &str, op: Operation) -> Result<VmState, crate::V2mError> {
        self.after(op).ok_or_else(|| {
            let allowed = Self::allowed_from(op);
            crate::V2mError::InvalidTransition {
                vm: vm.to_owned(),
                operation: op,
                from: self,
                allowed: if allowed.is_empty() {
                    "nowhere".into()
                } else {
                    allowed
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            }
        })
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VmState::Defined => "defined",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Migrating => "migrating",
            VmState::Stopped => "stopped",
        })
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Define => "define",
            Operation::Start => "start",
            Operation::Stop => "stop",
            Operation::Pause => "pause",
            Operation::Resume => "resume",
            Operation::Migrate => "migrate",
            Operation::FinishIncoming => "finish an incoming migration",
            Operation::PrepareIncoming => "prepare an incoming migration",
            Operation::Checkpoint => "checkpoint",
            Operation::Restore => "restore",
            Operation::ConsoleLog => "read the console log",
            Operation::VcpuThreads => "list vCPU threads",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn life_cycle() {
        use Operation as O;
        use VmState as S;
        assert_eq!(S::Defined.after(O::Start), Some(S::Running));
        assert_eq!(S::Running.after(O::Pause), Some(S::Paused));
        assert_eq!(S::Paused.after(O::Resume), Some(S::Running));
        assert_eq!(S::Running.after(O::Migrate), Some(S::Stopped));
        assert_eq!(S::Migrating.after(O::FinishIncoming), Some(S::Running));
        assert_eq!(S::Running.after(O::Checkpoint), Some(S::Paused));
        // The invalid ones the conformance suite also exercises against real hypervisors.
        assert_eq!(S::Running.after(O::Start), None);
        assert_eq!(S::Stopped.after(O::Migrate), None);
        assert_eq!(S::Stopped.after(O::Stop), None);
        assert_eq!(S::Running.after(O::Resume), None);
        assert_eq!(S::Defined.after(O::Pause), None);
        // Stopped is terminal except for reading what the guest printed.
        for op in [
            O::Start,
            O::Pause,
            O::Resume,
            O::Migrate,
            O::Checkpoint,
            O::FinishIncoming,
        ] {
            assert_eq!(S::Stopped.after(op), None, "{op}");
        }
    }

    #[test]
    fn invalid_transition_error_names_allowed_states() {
        let e = VmState::Running.check("vm1", Operation::Start).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("cannot start while running"), "{msg}");
        assert!(msg.contains("allowed from: defined"), "{msg}");
    }
}
