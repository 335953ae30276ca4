//! What `vse evacuate` and `vse checkpoint` share: a request queued in a running job's state
//! database, and the wait for its end, with their errors' exit codes.

use crate::exit::Failure;
use control::state::{ControllerError, WaitError};
use vse_exit::ErrorKind;

/// Queuing failed: an unknown job or node is the caller's mistake (exit 2), a database
/// failure is not.
pub(super) fn queue_error(e: ControllerError) -> anyhow::Error {
    match e {
        ControllerError::NotFound { .. } => Failure::invalid(e.to_string()).into(),
        e => anyhow::Error::from(e),
    }
}

/// The request's end, or why the wait ended without it (the job's controller went away, or
/// the time ran out: internal, exit 1).
pub(super) fn waited<T>(r: Result<T, WaitError>) -> anyhow::Result<T> {
    match r {
        Ok(r) => Ok(r),
        Err(e @ WaitError::State(_)) => Err(e.into()),
        Err(e) => Err(Failure::new(ErrorKind::Internal, e.to_string()).into()),
    }
}
