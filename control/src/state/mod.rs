//! Controller state (seed 000 §V, seed 002 §3): free and defunct pools, the job → VM →
//! node mapping with its migration history, each VM's memory maximum and the latest samples,
//! kept in SQLite. Every change is one transaction, and migrations are journalled with their
//! state, so a controller killed at any point — even mid-migration — restarts, finishes or
//! rolls back what was in flight, and loses nothing.

mod checkpoints;
mod error;
mod history;
mod journal;
mod recover;
mod requests;
mod schema;
mod store;

pub use checkpoints::CheckpointRequest;
pub use error::ControllerError;
pub use journal::{
    MigrationEvent, MigrationId, MigrationRecord, MigrationState, MoveRecord, Transfer,
};
pub use recover::{LocateError, Recovered, VmLocator};
pub use requests::{Heartbeat, RequestKind, RequestRecord, RequestState, WaitError, now_ms_u64};
pub use store::{NodeRecord, SampleRecord, StateDb, VmRecord};
