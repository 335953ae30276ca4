//! Requests to a running job's controller from other processes (`vse evacuate`), and the
//! controller's heartbeat that tells them whether anyone is there to answer. The database is
//! the only channel: vse has no resident daemon and no socket to the front-end, and a request
//! written here survives a controller restart like the migration journal does.

use super::store::{corrupt, now_ms, parse_id};
use super::{ControllerError, StateDb};
use monitor::{JobId, NodeName};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// Move every VM of the job off a node, then mark the node defunct.
    Evacuate,
}

/// Where a request stands. `Failed` carries its reason in the note; `NoSpare` is a failure
/// callers tell apart (nothing moved: no spare node could take the VMs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    Pending,
    Running,
    Done,
    Failed,
    NoSpare,
}

impl RequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::NoSpare => "no_spare",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Running,
            Self::Done,
            Self::Failed,
            Self::NoSpare,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::NoSpare)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub id: i64,
    pub job: JobId,
    pub kind: RequestKind,
    pub node: NodeName,
    pub state: RequestState,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The migration that carried it out, once planned.
    pub migration: Option<i64>,
    pub note: String,
}

/// The controller's last sign of life for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Heartbeat {
    pub pid: u32,
    pub beat_ms: u64,
    /// How often it beats; a reader waits a few periods before calling it gone.
    pub period_ms: u64,
}

type Row = (i64, String, String, String, i64, i64, Option<i64>, String);

fn record(r: Row) -> Result<RequestRecord, ControllerError> {
    let (id, job, node, state, created, updated, migration, note) = r;
    Ok(RequestRecord {
        id,
        job: parse_id(job)?,
        kind: RequestKind::Evacuate,
        node: parse_id(node)?,
        state: RequestState::parse(&state)
            .ok_or_else(|| corrupt(format!("request state `{state}`")))?,
        created_ms: created as u64,
        updated_ms: updated as u64,
        migration,
        note,
    })
}

const COLUMNS: &str = "id, job, node, state, created_ms, updated_ms, migration, note";

/// A request names a job the database knows.
pub(super) fn known_job(
    tx: &rusqlite::Transaction<'_>,
    job: &JobId,
) -> Result<(), ControllerError> {
    let known: Option<i64> = tx
        .query_row("SELECT 1 FROM jobs WHERE id = ?1", [job.as_str()], |r| {
            r.get(0)
        })
        .optional()?;
    match known {
        Some(_) => Ok(()),
        None => Err(ControllerError::NotFound {
            what: "job",
            name: job.to_string(),
            hint: "`vse status --db DB` lists the jobs this database knows",
        }),
    }
}

/// Milliseconds since the epoch, as the heartbeat records them.
pub fn now_ms_u64() -> u64 {
    now_ms().max(0) as u64
}

impl StateDb {
    /// Queues an evacuation of `node` for `job`'s controller; the job and node must be known.
    pub fn request_evacuation(
        &mut self,
        job: &JobId,
        node: &NodeName,
    ) -> Result<i64, ControllerError> {
        let tx = self.write()?;
        known_job(&tx, job)?;
        let on: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM nodes WHERE name = ?1",
                [node.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        if on.is_none() {
            return Err(ControllerError::NotFound {
                what: "node",
                name: node.to_string(),
                hint: "name a node of the job's allocation (`vse status` lists them)",
            });
        }
        let now = now_ms();
        tx.execute(
            "INSERT INTO requests (job, kind, node, state, created_ms, updated_ms)
             VALUES (?1, 'evacuate', ?2, 'pending', ?3, ?3)",
            params![job.as_str(), node.as_str(), now],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// Requests for `job` still waiting for the controller, oldest first.
    pub fn pending_requests(&self, job: &JobId) -> Result<Vec<RequestRecord>, ControllerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM requests WHERE job = ?1 AND state IN ('pending', 'running')
             ORDER BY id"
        ))?;
        let rows = stmt.query_map([job.as_str()], row)?;
        rows.map(|r| record(r?)).collect()
    }

    pub fn request(&self, id: i64) -> Result<RequestRecord, ControllerError> {
        let r = self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM requests WHERE id = ?1"),
                [id],
                row,
            )
            .optional()?
            .ok_or_else(|| ControllerError::NotFound {
                what: "request",
                name: id.to_string(),
                hint: "request ids come from `vse evacuate`",
            })?;
        record(r)
    }

    /// Moves a request on; a terminal request is not changed again.
    pub fn update_request(
        &mut self,
        id: i64,
        state: RequestState,
        migration: Option<i64>,
        note: &str,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute(
            "UPDATE requests SET state = ?2, migration = COALESCE(?3, migration), note = ?4,
                 updated_ms = ?5
             WHERE id = ?1 AND state IN ('pending', 'running')",
            params![id, state.as_str(), migration, note, now_ms()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The controller of `job` is alive (called once per sampling round).
    pub fn beat(&mut self, job: &JobId, period_ms: u64) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute(
            "INSERT INTO controllers (job, pid, beat_ms, period_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(job) DO UPDATE SET pid = ?2, beat_ms = ?3, period_ms = ?4",
            params![job.as_str(), std::process::id(), now_ms(), period_ms as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The controller of `job` has ended: readers stop waiting at once.
    pub fn end_beat(&mut self, job: &JobId) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute("DELETE FROM controllers WHERE job = ?1", [job.as_str()])?;
        tx.commit()?;
        Ok(())
    }

    pub fn heartbeat(&self, job: &JobId) -> Result<Option<Heartbeat>, ControllerError> {
        let r: Option<(i64, i64, i64)> = self
            .conn
            .query_row(
                "SELECT pid, beat_ms, period_ms FROM controllers WHERE job = ?1",
                [job.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(r.map(|(pid, beat, period)| Heartbeat {
            pid: pid as u32,
            beat_ms: beat as u64,
            period_ms: period as u64,
        }))
    }

    /// Jobs with a controller that beat recently, newest first.
    pub fn live_jobs(&self, now: u64) -> Result<Vec<JobId>, ControllerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT job, beat_ms, period_ms FROM controllers ORDER BY beat_ms DESC")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (job, beat, period) = r?;
            let hb = Heartbeat {
                pid: 0,
                beat_ms: beat as u64,
                period_ms: period as u64,
            };
            if hb.alive(now) {
                out.push(parse_id(job)?);
            }
        }
        Ok(out)
    }
}

/// Why waiting for a request ended without its outcome.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(transparent)]
    State(#[from] ControllerError),
    #[error(
        "the controller of job {job} is gone (no sign of life for {silent_s} s): request {id} \
         was not carried out; hint: is the job still running? (`vse status`)"
    )]
    Gone { job: JobId, id: i64, silent_s: u64 },
    #[error("request {id} did not finish within {after:?}; it stays queued (`vse status`)")]
    Timeout { id: i64, after: std::time::Duration },
}

impl StateDb {
    /// Polls request `id` until it ends, its job's controller is gone, or `timeout` passed.
    pub fn wait_request(
        &self,
        id: i64,
        timeout: std::time::Duration,
    ) -> Result<RequestRecord, WaitError> {
        self.poll(id, timeout, Self::request, |r| (&r.job, r.state))
    }
}

impl StateDb {
    /// Polls request `id` (read by `get`; `job_state` says whose it is and where it stands)
    /// until it ends, its job's controller is gone, or `timeout` passed.
    pub(super) fn poll<R>(
        &self,
        id: i64,
        timeout: std::time::Duration,
        get: impl Fn(&Self, i64) -> Result<R, ControllerError>,
        job_state: impl Fn(&R) -> (&JobId, RequestState),
    ) -> Result<R, WaitError> {
        let start = std::time::Instant::now();
        loop {
            let r = get(self, id)?;
            let (job, state) = job_state(&r);
            if state.is_terminal() {
                return Ok(r);
            }
            let now = now_ms() as u64;
            match self.heartbeat(job)? {
                Some(hb) if hb.alive(now) => {}
                hb => {
                    return Err(WaitError::Gone {
                        silent_s: hb.map_or(0, |h| now.saturating_sub(h.beat_ms) / 1000),
                        job: job.clone(),
                        id,
                    });
                }
            }
            if start.elapsed() >= timeout {
                return Err(WaitError::Timeout { id, after: timeout });
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Heartbeat {
    /// A controller that missed several rounds is gone (a round may stall behind a migration,
    /// which is why the margin is generous).
    pub fn alive(&self, now_ms: u64) -> bool {
        let margin = (self.period_ms * 5).max(30_000);
        now_ms.saturating_sub(self.beat_ms) <= margin
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pool;

    #[test]
    fn requests_are_checked_queued_and_end_once() {
        let d = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(&d.path().join("s.db")).unwrap();
        let job = JobId::new("j1").unwrap();
        let n1 = NodeName::new("n1").unwrap();
        let e = db.request_evacuation(&job, &n1).unwrap_err();
        assert!(e.to_string().contains("job `j1` is not known"), "{e}");
        db.upsert_node(&n1, Pool::Free).unwrap();
        db.add_vm(&job, &monitor::VmId::new("j1-r0").unwrap(), &n1, 1024)
            .unwrap();
        let e = db
            .request_evacuation(&job, &NodeName::new("n9").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("node `n9` is not known"), "{e}");
        let id = db.request_evacuation(&job, &n1).unwrap();
        assert_eq!(db.pending_requests(&job).unwrap().len(), 1);
        db.update_request(id, RequestState::Done, None, "moved 1 VM")
            .unwrap();
        // A terminal request is final: a late writer does not reopen it.
        db.update_request(id, RequestState::Failed, None, "late")
            .unwrap();
        let r = db.request(id).unwrap();
        assert_eq!(
            (r.state, r.migration, r.note.as_str()),
            (RequestState::Done, None, "moved 1 VM")
        );
        assert!(db.pending_requests(&job).unwrap().is_empty());
    }

    #[test]
    fn heartbeat_tells_a_live_controller_from_a_gone_one() {
        let d = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(&d.path().join("s.db")).unwrap();
        let job = JobId::new("j1").unwrap();
        assert_eq!(db.heartbeat(&job).unwrap(), None);
        db.beat(&job, 1000).unwrap();
        let hb = db.heartbeat(&job).unwrap().unwrap();
        assert!(hb.alive(hb.beat_ms + 1000));
        assert!(!hb.alive(hb.beat_ms + 60_000));
        assert_eq!(db.live_jobs(hb.beat_ms).unwrap(), vec![job.clone()]);
        db.end_beat(&job).unwrap();
        assert_eq!(db.heartbeat(&job).unwrap(), None);
    }
}
