//! The control plane of a job: the controller's state (SQLite: pools, placement, samples, the
//! migration journal and crash recovery) and the migration daemon (rules, guards, the
//! barrier-coordinated protocol). SQLite lives here and nowhere else.
//!
//! Dependencies run one way: `model` (shared vocabulary) ← `state` ← `migrate`.

#![forbid(unsafe_code)]

pub mod locate;
pub mod migrate;
pub mod model;
pub mod state;
mod sync;
