//! Agent roles (seed 003 §3) and who may do what. One process per node plays several roles;
//! this module is where the boundaries are written down and checked.
//!
//! | role       | where             | privileges                                                  |
//! |------------|-------------------|-------------------------------------------------------------|
//! | FrontEnd   | where `vse launch` runs (agent 0) | holds the user's policy; the only one that may order a job-wide shutdown or start commands |
//! | Controller | inside every agent | job state only: topology, routing tables, the dead set; no side effects |
//! | Root       | one per node      | privileged: spawns child agents, owns node resources and VMs, kills them |
//! | Session    | one per node      | acts for the user: runs the user's command, streams its output |
//! | Tool       | one per VM        | drives V2M for its VM (start, stop), under the root agent    |

use crate::proto::{Msg, NodeId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    FrontEnd,
    Controller,
    Root,
    Session,
    Tool,
}

/// The role that must handle a control message, so dispatch cannot route e.g. a user command
/// to the privileged part by accident.
pub fn handler(msg: &Msg) -> Role {
    match msg {
        Msg::Hello { .. } | Msg::Welcome { .. } | Msg::Ping { .. } | Msg::Pong { .. } => {
            Role::Controller
        }
        Msg::SubtreeReady { .. } | Msg::Directory { .. } | Msg::OverlayReady { .. } => {
            Role::Controller
        }
        Msg::Failed { .. } | Msg::Routed { .. } => Role::Controller,
        Msg::Exec { .. } | Msg::Output { .. } | Msg::Exited { .. } => Role::Session,
        Msg::Chunk { .. }
        | Msg::StageOffer { .. }
        | Msg::StageHave { .. }
        | Msg::StageReport { .. } => Role::Root,
        Msg::LaunchStage | Msg::StageListening { .. } | Msg::LaunchVms { .. } => Role::Root,
        Msg::RankOutput { .. } | Msg::RankExited { .. } | Msg::VmEndpoint { .. } => Role::Tool,
        // Monitoring is the root agent's: it reads the node and the hypervisor processes.
        Msg::MonitorStart { .. } | Msg::Samples { .. } | Msg::MonitorFailed { .. } => Role::Root,
        // The barrier relay speaks for the guest's ranks through the VM's guest agent.
        Msg::BarrierUp { .. }
        | Msg::BarrierUpClosed { .. }
        | Msg::BarrierDown { .. }
        | Msg::BarrierDownClosed { .. } => Role::Tool,
        // Moving a VM is privileged: the root agent drives V2M on both ends.
        Msg::MigrateOut { .. }
        | Msg::MigrateIn { .. }
        | Msg::MigrateListening { .. }
        | Msg::MigrateSent { .. }
        | Msg::MigrateDone { .. } => Role::Root,
        Msg::Shutdown { .. } => Role::Root,
    }
}

/// Orders only the front-end may give: a node agent receiving one from anyone but agent 0 drops it.
pub fn front_end_only(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Exec { .. }
            | Msg::Directory { .. }
            | Msg::Chunk { .. }
            | Msg::LaunchStage
            | Msg::LaunchVms { .. }
            | Msg::MonitorStart { .. }
            | Msg::MigrateOut { .. }
            | Msg::BarrierDown { .. }
            | Msg::BarrierDownClosed { .. }
    )
}

/// Agent 0 is the front-end; every other id is a node agent (root + session + tools).
pub fn roles_of(id: NodeId) -> &'static [Role] {
    if id.0 == 0 {
        &[Role::FrontEnd, Role::Controller]
    } else {
        &[Role::Controller, Role::Root, Role::Session, Role::Tool]
    }
}
