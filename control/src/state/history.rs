//! Reading the journal: migrations with their moves, for the daemon (what is in flight)
//! and for `vse status`.

use super::journal::{
    MigrationEvent, MigrationId, MigrationRecord, MigrationState, MoveRecord, Transfer,
};
use super::store::{corrupt, parse_id};
use super::{ControllerError, StateDb};
use crate::model::SourceFate;
use monitor::{JobId, VmId};
use rusqlite::params;
use std::collections::HashSet;

impl StateDb {
    pub(super) fn migrating_vms(&self) -> Result<HashSet<VmId>, ControllerError> {
        let mut stmt = self.conn.prepare(
            "SELECT mm.vm FROM migration_moves mm JOIN migrations m ON m.id = mm.migration
             WHERE m.state NOT IN ('done', 'rolled_back') AND mm.moved = 0",
        )?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.map(|r| parse_id(r?)).collect()
    }

    /// Migrations, newest first; only unfinished ones if `active_only`.
    pub fn migrations(
        &self,
        job: Option<&JobId>,
        active_only: bool,
    ) -> Result<Vec<MigrationRecord>, ControllerError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, job, source, source_fate, rule, reason, state, created_ms, updated_ms, deadline_ms, note
             FROM migrations WHERE (?1 IS NULL OR job = ?1)
               AND (?2 = 0 OR state NOT IN ('done', 'rolled_back')) ORDER BY id DESC",
        )?;
        type Row = (
            i64,
            String,
            String,
            String,
            String,
            String,
            String,
            i64,
            i64,
            Option<i64>,
            String,
        );
        let rows: Vec<Row> = stmt
            .query_map(params![job.map(|j| j.as_str()), active_only as i64], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                    r.get(9)?,
                    r.get(10)?,
                ))
            })?
            .collect::<Result<_, _>>()?;
        let mut mv = self.conn.prepare(
            "SELECT mm.vm, mm.dest, mm.mem_max_kib, mm.ready, mm.moved, t.storage, t.disk_bytes,
                    t.memory_bytes, t.total_ms, t.downtime_ms
             FROM migration_moves mm LEFT JOIN migration_transfers t
               ON t.migration = mm.migration AND t.vm = mm.vm
             WHERE mm.migration = ?1 ORDER BY mm.vm",
        )?;
        let mut ev = self.conn.prepare(
            "SELECT state, at_ms FROM migration_events WHERE migration = ?1 ORDER BY rowid",
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, job, source, fate, rule, reason, state, created, updated, deadline, note) in rows {
            let moves = mv
                .query_map([id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, bool>(3)?,
                        r.get::<_, bool>(4)?,
                        transfer_of(r)?,
                    ))
                })?
                .map(|r| {
                    let (vm, dest, max, ready, moved, transfer) = r?;
                    Ok(MoveRecord {
                        vm: parse_id(vm)?,
                        dest: parse_id(dest)?,
                        mem_max_kib: max as u64,
                        ready,
                        moved,
                        transfer,
                    })
                })
                .collect::<Result<Vec<_>, ControllerError>>()?;
            let events = ev
                .query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .map(|r| {
                    let (state, at) = r?;
                    Ok(MigrationEvent {
                        state: MigrationState::parse(&state)
                            .ok_or_else(|| corrupt(format!("event state `{state}`")))?,
                        at_ms: at.max(0) as u64,
                    })
                })
                .collect::<Result<Vec<_>, ControllerError>>()?;
            out.push(MigrationRecord {
                id: MigrationId(id),
                job: parse_id(job)?,
                source: parse_id(source)?,
                source_fate: SourceFate::parse(&fate)
                    .ok_or_else(|| corrupt(format!("fate `{fate}`")))?,
                rule,
                reason,
                state: MigrationState::parse(&state)
                    .ok_or_else(|| corrupt(format!("state `{state}`")))?,
                created_ms: created as u64,
                updated_ms: updated as u64,
                deadline_ms: deadline.map(|d| d as u64),
                note,
                moves,
                events,
            });
        }
        Ok(out)
    }

    pub fn migration(&self, id: MigrationId) -> Result<MigrationRecord, ControllerError> {
        self.migrations(None, false)?
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| ControllerError::NotFound {
                what: "migration",
                name: id.to_string(),
                hint: "see `vse status`",
            })
    }
}

/// Columns 5..=9 of a move joined with its transfer (all NULL before the move is done).
fn transfer_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Transfer>> {
    let Some(storage) = r.get::<_, Option<String>>(5)? else {
        return Ok(None);
    };
    let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
    Ok(Some(Transfer {
        storage,
        disk_bytes: n(6)?,
        memory_bytes: n(7)?,
        total_ms: n(8)?,
        downtime_ms: n(9)?,
    }))
}
