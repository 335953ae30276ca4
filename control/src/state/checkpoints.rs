//! Checkpoint requests (`vse checkpoint --job ID`): queued here for the job's front-end, which
//! takes the checkpoint and records where it went (or why it could not). Like evacuations,
//! the database is the only channel to a running job.

use super::requests::{WaitError, known_job};
use super::store::{corrupt, now_ms, parse_id};
use super::{ControllerError, RequestState, StateDb};
use monitor::JobId;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointRequest {
    pub id: i64,
    pub job: JobId,
    pub state: RequestState,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The checkpoint's directory, once taken.
    pub path: String,
    pub note: String,
}

impl StateDb {
    /// Queues a checkpoint of `job`, which must be known.
    pub fn request_checkpoint(&mut self, job: &JobId) -> Result<i64, ControllerError> {
        let tx = self.write()?;
        known_job(&tx, job)?;
        tx.execute(
            "INSERT INTO checkpoints (job, state, created_ms, updated_ms)
             VALUES (?1, 'pending', ?2, ?2)",
            params![job.as_str(), now_ms()],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// Checkpoint requests of `job` nobody took yet, oldest first.
    pub fn pending_checkpoints(&self, job: &JobId) -> Result<Vec<i64>, ControllerError> {
        let mut stmt = self.conn.prepare(
            "SELECT id FROM checkpoints WHERE job = ?1 AND state = 'pending' ORDER BY id",
        )?;
        let rows = stmt.query_map([job.as_str()], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Moves a checkpoint request on; a finished one is not changed again.
    pub fn update_checkpoint(
        &mut self,
        id: i64,
        state: RequestState,
        path: &str,
        note: &str,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute(
            "UPDATE checkpoints SET state = ?2, path = ?3, note = ?4, updated_ms = ?5
             WHERE id = ?1 AND state IN ('pending', 'running')",
            params![id, state.as_str(), path, note, now_ms()],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn checkpoint_request(&self, id: i64) -> Result<CheckpointRequest, ControllerError> {
        let r: Option<(String, String, i64, i64, String, String)> = self
            .conn
            .query_row(
                "SELECT job, state, created_ms, updated_ms, path, note FROM checkpoints
                 WHERE id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .optional()?;
        let (job, state, created, updated, path, note) =
            r.ok_or_else(|| ControllerError::NotFound {
                what: "checkpoint request",
                name: id.to_string(),
                hint: "checkpoint request ids come from `vse checkpoint`",
            })?;
        Ok(CheckpointRequest {
            id,
            job: parse_id(job)?,
            state: RequestState::parse(&state)
                .ok_or_else(|| corrupt(format!("checkpoint state `{state}`")))?,
            created_ms: created as u64,
            updated_ms: updated as u64,
            path,
            note,
        })
    }

    /// Polls checkpoint request `id` until it ends, its job's controller is gone, or
    /// `timeout` passed.
    pub fn wait_checkpoint(
        &self,
        id: i64,
        timeout: std::time::Duration,
    ) -> Result<CheckpointRequest, WaitError> {
        self.poll(id, timeout, Self::checkpoint_request, |r| (&r.job, r.state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pool;
    use monitor::{NodeName, VmId};

    #[test]
    fn checkpoint_requests_are_queued_for_known_jobs_and_end_once() {
        let d = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(&d.path().join("s.db")).unwrap();
        let job = JobId::new("j1").unwrap();
        let e = db.request_checkpoint(&job).unwrap_err();
        assert!(
            matches!(e, ControllerError::NotFound { what: "job", .. }),
            "{e}"
        );
        let node = NodeName::new("n1").unwrap();
        db.upsert_node(&node, Pool::Free).unwrap();
        db.add_vm(&job, &VmId::new("j1-r0").unwrap(), &node, 1024)
            .unwrap();
        let id = db.request_checkpoint(&job).unwrap();
        assert_eq!(db.pending_checkpoints(&job).unwrap(), vec![id]);
        db.update_checkpoint(id, RequestState::Running, "", "taking")
            .unwrap();
        assert!(db.pending_checkpoints(&job).unwrap().is_empty());
        db.update_checkpoint(id, RequestState::Done, "/c/ckpt-1", "ok")
            .unwrap();
        db.update_checkpoint(id, RequestState::Failed, "", "late")
            .unwrap();
        let r = db.checkpoint_request(id).unwrap();
        assert_eq!(
            (r.state, r.path.as_str()),
            (RequestState::Done, "/c/ckpt-1")
        );
    }
}
