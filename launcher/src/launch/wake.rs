//! What the running job's loop wakes up for besides its agents' events: a checkpoint due,
//! the batch system's SIGTERM, a `vse checkpoint` request in the state database.

use super::checkpoint::{NotTaken, Taken};
use super::front::Ended;
use crate::ckpt::Reason;
use std::path::Path;
use std::time::Duration;

type Event = agents::agent::Event<crate::wire::Wire>;

/// What the running job's loop woke up for.
// One value at a time lives on the loop's stack, matched at once: boxing the event would
// only add an allocation per message.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    Event(Result<Option<Event>, Ended>),
    Due(Reason),
    /// `vse checkpoint` request `id`.
    Asked(i64),
}

/// How often the job looks for `vse checkpoint` requests in its state database.
pub(super) const REQUEST_POLL: Duration = Duration::from_secs(1);

/// `vse checkpoint` requests for this job, from its state database (its own connection).
pub(super) struct Requests {
    db: control::state::StateDb,
    job: monitor::JobId,
}

impl Requests {
    pub fn open(db: &Path, job: &str) -> Option<Self> {
        Some(Self {
            db: control::state::StateDb::open(db).ok()?,
            job: monitor::JobId::new(job.to_string()).ok()?,
        })
    }

    /// The oldest pending request, marked as taken.
    pub fn next(&mut self) -> Option<i64> {
        let id = *self.db.pending_checkpoints(&self.job).ok()?.first()?;
        let running = control::state::RequestState::Running;
        self.db.update_checkpoint(id, running, "", "taking").ok()?;
        Some(id)
    }

    pub fn failed(&mut self, id: i64, why: &str) {
        let failed = control::state::RequestState::Failed;
        let _ = self.db.update_checkpoint(id, failed, "", why);
    }

    pub fn answer(&mut self, id: i64, r: &Result<Taken, NotTaken>) {
        use control::state::RequestState;
        let _ = match r {
            Ok(t) => {
                let note = format!("{} MiB in {} ms", t.bytes >> 20, t.duration_ms);
                let path = t.path.display().to_string();
                self.db
                    .update_checkpoint(id, RequestState::Done, &path, &note)
            }
            Err(e) => self
                .db
                .update_checkpoint(id, RequestState::Failed, "", &e.to_string()),
        };
    }
}

type Signal = tokio::signal::unix::Signal;

/// The batch system's request to end (Slurm's preemption, requeue, `scancel`; PBS's qdel).
pub(super) fn terminate_signal() -> Option<Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("vse launch: cannot catch SIGTERM, no checkpoint on preemption: {e}");
            None
        }
    }
}

pub(super) async fn recv(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

pub(super) async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
