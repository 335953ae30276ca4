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
//!
//! The runtime enforces the front-end's privilege on every message routed to an agent: the
//! directory, and whatever the application's payload marks [`Payload::front_end_only`].

use crate::proto::{Msg, Payload};

/// Orders only the front-end may give: a node agent receiving one from anyone but agent 0
/// drops it.
pub fn front_end_only<A: Payload>(msg: &Msg<A>) -> bool {
    match msg {
        Msg::Directory { .. } => true,
        Msg::App(a) => a.front_end_only(),
        _ => false,
    }
}
