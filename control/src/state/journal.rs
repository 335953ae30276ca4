//! The migration journal: one row per migration with its state, one per VM move, and an
//! event log. States follow seed 002 §3:
//! planned → notice_posted (1a notice + 1b destination acquired) → ranks_ready (2) →
//! migrating (3) → done (4 ack, 5 source fate) | rolled_back.

use super::store::{corrupt, now_ms};
use super::{ControllerError, StateDb};
use crate::model::{Plan, SourceFate};
use monitor::{JobId, NodeName, VmId};
use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct MigrationId(pub i64);

impl std::fmt::Display for MigrationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    Planned,
    NoticePosted,
    RanksReady,
    Migrating,
    Done,
    RolledBack,
}

impl MigrationState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::NoticePosted => "notice_posted",
            Self::RanksReady => "ranks_ready",
            Self::Migrating => "migrating",
            Self::Done => "done",
            Self::RolledBack => "rolled_back",
        }
    }
    pub(super) fn parse(s: &str) -> Option<Self> {
        [
            Self::Planned,
            Self::NoticePosted,
            Self::RanksReady,
            Self::Migrating,
            Self::Done,
            Self::RolledBack,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::RolledBack)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoveRecord {
    pub vm: VmId,
    pub dest: NodeName,
    pub mem_max_kib: u64,
    pub ready: bool,
    pub moved: bool,
    /// What the move carried, once it is done (from the hypervisor's own measurements).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer: Option<Transfer>,
}

/// What one VM's live migration moved, as the hypervisor measured it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// "shared" (the destination opened the source's disk in place) or "block-copy" (the
    /// disk overlay was copied to the destination's own disk).
    pub storage: String,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
    pub total_ms: u64,
    /// The pause the guest saw, as QEMU measured it.
    pub downtime_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigrationRecord {
    pub id: MigrationId,
    pub job: JobId,
    pub source: NodeName,
    pub source_fate: SourceFate,
    pub rule: String,
    pub reason: String,
    pub state: MigrationState,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub deadline_ms: Option<u64>,
    pub note: String,
    pub moves: Vec<MoveRecord>,
    /// Every state the migration went through, oldest first: the time it took from the notice
    /// to the ranks at their barrier, and from there to the moves done, is read off these.
    pub events: Vec<MigrationEvent>,
}

/// One state change of a migration and when it happened (ms since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigrationEvent {
    pub state: MigrationState,
    pub at_ms: u64,
}

fn state_of(tx: &Transaction<'_>, id: MigrationId) -> Result<MigrationState, ControllerError> {
    let s: Option<String> = tx
        .query_row("SELECT state FROM migrations WHERE id = ?1", [id.0], |r| {
            r.get(0)
        })
        .optional()?;
    let s = s.ok_or_else(|| ControllerError::NotFound {
        what: "migration",
        name: id.to_string(),
        hint: "see `vse status --json` for the migration history",
    })?;
    MigrationState::parse(&s).ok_or_else(|| corrupt(format!("migration state `{s}`")))
}

fn set_state(
    tx: &Transaction<'_>,
    id: MigrationId,
    state: MigrationState,
    note: &str,
) -> Result<(), ControllerError> {
    let now = now_ms();
    tx.execute(
        "UPDATE migrations SET state = ?2, updated_ms = ?3,
                note = CASE WHEN ?4 = '' THEN note ELSE ?4 END WHERE id = ?1",
        params![id.0, state.as_str(), now, note],
    )?;
    tx.execute(
        "INSERT INTO migration_events(migration, at_ms, state, note) VALUES (?1, ?2, ?3, ?4)",
        params![id.0, now, state.as_str(), note],
    )?;
    Ok(())
}

fn expect(
    id: MigrationId,
    got: MigrationState,
    allowed: &[MigrationState],
    expected: &'static str,
) -> Result<(), ControllerError> {
    if allowed.contains(&got) {
        Ok(())
    } else {
        Err(ControllerError::BadState {
            id: id.0,
            state: got.as_str().into(),
            expected,
        })
    }
}

impl StateDb {
    /// Journals a plan from the daemon. Refuses VMs that are not on the source or already
    /// part of an unfinished migration, and defunct destinations.
    pub fn plan_migration(&mut self, plan: &Plan) -> Result<MigrationId, ControllerError> {
        let busy = self.migrating_vms()?;
        let tx = self.write()?;
        for m in &plan.moves {
            let node: Option<String> = tx
                .query_row("SELECT node FROM vms WHERE id = ?1", [m.vm.as_str()], |r| {
                    r.get(0)
                })
                .optional()?;
            if node.as_deref() != Some(plan.source.as_str()) {
                return Err(ControllerError::Conflict(format!(
                    "VM {} is not on {} (it is on {})",
                    m.vm,
                    plan.source,
                    node.as_deref().unwrap_or("no node")
                )));
            }
            if busy.contains(&m.vm) {
                return Err(ControllerError::Conflict(format!(
                    "VM {} is already being migrated",
                    m.vm
                )));
            }
            let pool: Option<String> = tx
                .query_row(
                    "SELECT pool FROM nodes WHERE name = ?1",
                    [m.dest.as_str()],
                    |r| r.get(0),
                )
                .optional()?;
            if pool.as_deref().is_none_or(|p| p == "defunct") {
                return Err(ControllerError::Conflict(format!(
                    "destination {} is unknown or defunct",
                    m.dest
                )));
            }
        }
        let now = now_ms();
        tx.execute(
            "INSERT INTO migrations(job, source, source_fate, rule, reason, state, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, 'planned', ?6, ?6)",
            params![plan.job.as_str(), plan.source.as_str(), plan.source_fate.as_str(),
                    plan.rule, plan.reason, now],
        )?;
        let id = MigrationId(tx.last_insert_rowid());
        for m in &plan.moves {
            tx.execute(
                "INSERT INTO migration_moves(migration, vm, dest, mem_max_kib) VALUES (?1, ?2, ?3, ?4)",
                params![id.0, m.vm.as_str(), m.dest.as_str(), m.mem_max_kib as i64],
            )?;
        }
        tx.execute(
            "INSERT INTO migration_events(migration, at_ms, state, note) VALUES (?1, ?2, 'planned', ?3)",
            params![id.0, now, plan.reason],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Steps 1a + 1b: the notice is posted and the destinations are taken out of the free
    /// pool, in one transaction so no other plan can pick them.
    pub fn post_notice(
        &mut self,
        id: MigrationId,
        deadline_ms: u64,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        expect(
            id,
            state_of(&tx, id)?,
            &[MigrationState::Planned],
            "planned",
        )?;
        tx.execute(
            "UPDATE nodes SET pool = 'allocated', updated_ms = ?2
             WHERE name IN (SELECT dest FROM migration_moves WHERE migration = ?1)",
            params![id.0, now_ms()],
        )?;
        tx.execute(
            "UPDATE migrations SET deadline_ms = ?2 WHERE id = ?1",
            params![id.0, deadline_ms as i64],
        )?;
        set_state(&tx, id, MigrationState::NoticePosted, "")?;
        tx.commit()?;
        Ok(())
    }

    /// Step 2: an affected VM's ranks reached a barrier and block. Returns true once every VM
    /// of the migration is ready (the state then moves to `ranks_ready`).
    pub fn mark_ready(&mut self, id: MigrationId, vm: &VmId) -> Result<bool, ControllerError> {
        let tx = self.write()?;
        let st = state_of(&tx, id)?;
        expect(
            id,
            st,
            &[MigrationState::NoticePosted, MigrationState::RanksReady],
            "notice_posted",
        )?;
        let n = tx.execute(
            "UPDATE migration_moves SET ready = 1 WHERE migration = ?1 AND vm = ?2",
            params![id.0, vm.as_str()],
        )?;
        if n == 0 {
            return Err(ControllerError::Conflict(format!(
                "VM {vm} is not part of migration {id}"
            )));
        }
        let pending: i64 = tx.query_row(
            "SELECT COUNT(*) FROM migration_moves WHERE migration = ?1 AND ready = 0",
            [id.0],
            |r| r.get(0),
        )?;
        if pending == 0 && st == MigrationState::NoticePosted {
            set_state(&tx, id, MigrationState::RanksReady, "")?;
        }
        tx.commit()?;
        Ok(pending == 0)
    }

    /// Step 3 begins. From `notice_posted` only when the deadline passed (migrate anyway).
    pub fn start_migrating(&mut self, id: MigrationId, note: &str) -> Result<(), ControllerError> {
        let tx = self.write()?;
        let st = state_of(&tx, id)?;
        expect(
            id,
            st,
            &[MigrationState::NoticePosted, MigrationState::RanksReady],
            "ranks_ready",
        )?;
        set_state(&tx, id, MigrationState::Migrating, note)?;
        tx.commit()?;
        Ok(())
    }

    /// One VM now runs on its destination.
    pub fn mark_moved(&mut self, id: MigrationId, vm: &VmId) -> Result<(), ControllerError> {
        let tx = self.write()?;
        expect(
            id,
            state_of(&tx, id)?,
            &[MigrationState::Migrating],
            "migrating",
        )?;
        Self::apply_move(&tx, id, vm)?;
        tx.commit()?;
        Ok(())
    }

    /// What moving `vm` in migration `id` carried (kept with the migration's history).
    pub fn record_transfer(
        &mut self,
        id: MigrationId,
        vm: &VmId,
        t: &Transfer,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute(
            "INSERT OR REPLACE INTO migration_transfers
                 (migration, vm, storage, disk_bytes, memory_bytes, total_ms, downtime_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                id.0,
                vm.as_str(),
                t.storage,
                t.disk_bytes as i64,
                t.memory_bytes as i64,
                t.total_ms as i64,
                t.downtime_ms as i64
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn apply_move(tx: &Transaction<'_>, id: MigrationId, vm: &VmId) -> Result<(), ControllerError> {
        let dest: String = tx.query_row(
            "SELECT dest FROM migration_moves WHERE migration = ?1 AND vm = ?2",
            params![id.0, vm.as_str()],
            |r| r.get(0),
        )?;
        tx.execute(
            "UPDATE vms SET node = ?2, last_migrated_ms = ?3 WHERE id = ?1",
            params![vm.as_str(), dest, now_ms()],
        )?;
        tx.execute(
            "UPDATE migration_moves SET moved = 1 WHERE migration = ?1 AND vm = ?2",
            params![id.0, vm.as_str()],
        )?;
        Ok(())
    }

    /// Steps 4 + 5: every VM moved; the source takes its fate.
    pub fn complete(&mut self, id: MigrationId, note: &str) -> Result<(), ControllerError> {
        let tx = self.write()?;
        expect(
            id,
            state_of(&tx, id)?,
            &[MigrationState::Migrating],
            "migrating",
        )?;
        let pending: i64 = tx.query_row(
            "SELECT COUNT(*) FROM migration_moves WHERE migration = ?1 AND moved = 0",
            [id.0],
            |r| r.get(0),
        )?;
        if pending > 0 {
            return Err(ControllerError::Conflict(format!(
                "migration {id} still has {pending} VM(s) to move"
            )));
        }
        let (source, fate): (String, String) = tx.query_row(
            "SELECT source, source_fate FROM migrations WHERE id = ?1",
            [id.0],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let sql = match SourceFate::parse(&fate) {
            Some(SourceFate::Defunct) => {
                Some("UPDATE nodes SET pool = 'defunct', updated_ms = ?2 WHERE name = ?1")
            }
            Some(SourceFate::Free) => Some(
                "UPDATE nodes SET pool = 'free', updated_ms = ?2
                 WHERE name = ?1 AND NOT EXISTS (SELECT 1 FROM vms WHERE node = ?1)",
            ),
            Some(SourceFate::Keep) => None,
            None => return Err(corrupt(format!("source fate `{fate}`"))),
        };
        if let Some(sql) = sql {
            tx.execute(sql, params![source, now_ms()])?;
        }
        set_state(&tx, id, MigrationState::Done, note)?;
        tx.commit()?;
        Ok(())
    }

    /// Withdraws an unfinished migration. VMs already moved stay moved (they run there);
    /// destinations left empty go back to the free pool.
    pub fn roll_back(&mut self, id: MigrationId, note: &str) -> Result<(), ControllerError> {
        let tx = self.write()?;
        let st = state_of(&tx, id)?;
        if st.is_terminal() {
            return Err(ControllerError::BadState {
                id: id.0,
                state: st.as_str().into(),
                expected: "an unfinished state",
            });
        }
        set_state(&tx, id, MigrationState::RolledBack, note)?;
        tx.execute(
            "UPDATE nodes SET pool = 'free', updated_ms = ?2
             WHERE name IN (SELECT dest FROM migration_moves WHERE migration = ?1)
               AND pool = 'allocated'
               AND NOT EXISTS (SELECT 1 FROM vms WHERE vms.node = nodes.name)
               AND NOT EXISTS (SELECT 1 FROM migration_moves mm JOIN migrations m ON m.id = mm.migration
                               WHERE mm.dest = nodes.name AND m.state NOT IN ('done', 'rolled_back'))",
            params![id.0, now_ms()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Recovery helper: applies a move found done on the hypervisor side.
    pub(super) fn recover_move(
        &mut self,
        id: MigrationId,
        vm: &VmId,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        Self::apply_move(&tx, id, vm)?;
        tx.commit()?;
        Ok(())
    }
}
