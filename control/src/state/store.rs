//! Nodes, jobs, VMs and samples. Writes take an IMMEDIATE transaction so two controller
//! processes (the old one dying, the new one starting) never interleave half-updates.

use super::{ControllerError, schema::SCHEMA};
use crate::model::{ClusterView, NodeView, Pool, VmView};
use monitor::{JobId, NodeName, Sample, VmId};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde::Serialize;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub struct StateDb {
    pub(super) conn: Connection,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRecord {
    pub name: NodeName,
    pub pool: Pool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmRecord {
    pub vm: VmId,
    pub job: JobId,
    pub node: NodeName,
    pub mem_max_kib: u64,
    pub last_migrated_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleRecord {
    pub node: String,
    pub vm: Option<String>,
    pub sample: Sample,
}

pub(super) fn corrupt(what: impl Into<String>) -> ControllerError {
    ControllerError::Corrupt(what.into())
}

pub(super) fn parse_id<T: std::str::FromStr>(s: String) -> Result<T, ControllerError> {
    s.parse()
        .map_err(|_| corrupt(format!("invalid identifier `{s}`")))
}

/// Longest wait for another connection's write lock.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl StateDb {
    /// Opens (creating if needed) the state database. WAL keeps readers (`vse status`) off the
    /// controller's back; a busy timeout ([`BUSY_TIMEOUT`]) rides out a concurrent writer.
    ///
    /// The file is created 0600, and one that another user owns (root aside) or may write, or
    /// that sits in a directory others may change, is refused: its contents decide where the
    /// job's VMs go and what a resumed launch trusts. SQLite reopens it by path; the checked
    /// directory is what keeps that path naming the checked file.
    pub fn open(path: &Path) -> Result<Self, ControllerError> {
        let open = |e| ControllerError::Open {
            path: path.display().to_string(),
            source: e,
        };
        vse_base::private_file(path, "state database", true)?;
        let conn = Connection::open(path).map_err(open)?;
        // Generous: SQLite's busy wait is not fair, and a controller committing samples for many
        // VMs on a loaded disk (synchronous FULL) can keep a CLI's write out for seconds at a
        // time; waiting longer beats failing a user's `vse evacuate`.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open)?;
        conn.execute_batch(SCHEMA).map_err(open)?;
        Ok(Self { conn })
    }

    pub(super) fn write(&mut self) -> Result<Transaction<'_>, ControllerError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    /// Registers a node, or moves an existing one to `pool`.
    pub fn upsert_node(&mut self, name: &NodeName, pool: Pool) -> Result<(), ControllerError> {
        let tx = self.write()?;
        tx.execute(
            "INSERT INTO nodes(name, pool, updated_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET pool = excluded.pool, updated_ms = excluded.updated_ms",
            params![name.as_str(), pool.as_str(), now_ms()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Places a new VM of `job` on `node` (which becomes allocated).
    pub fn add_vm(
        &mut self,
        job: &JobId,
        vm: &VmId,
        node: &NodeName,
        mem_max_kib: u64,
    ) -> Result<(), ControllerError> {
        let tx = self.write()?;
        let pool: Option<String> = tx
            .query_row(
                "SELECT pool FROM nodes WHERE name = ?1",
                [node.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        match pool.as_deref() {
            None => {
                return Err(ControllerError::NotFound {
                    what: "node",
                    name: node.to_string(),
                    hint: "register nodes before placing VMs on them",
                });
            }
            Some("defunct") => {
                return Err(ControllerError::Conflict(format!(
                    "node {node} is in the defunct pool; VM {vm} cannot be placed there"
                )));
            }
            _ => {}
        }
        tx.execute(
            "INSERT INTO jobs(id, created_ms) VALUES (?1, ?2) ON CONFLICT(id) DO NOTHING",
            params![job.as_str(), now_ms()],
        )?;
        tx.execute(
            "INSERT INTO vms(id, job, node, mem_max_kib) VALUES (?1, ?2, ?3, ?4)",
            params![vm.as_str(), job.as_str(), node.as_str(), mem_max_kib as i64],
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                ControllerError::Conflict(format!("VM {vm} already exists"))
            }
            e => e.into(),
        })?;
        tx.execute(
            "UPDATE nodes SET pool = 'allocated', updated_ms = ?2 WHERE name = ?1",
            params![node.as_str(), now_ms()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Stores the latest sample per node and per VM (older ones are the sampler's history,
    /// exported through the hook, not the controller's).
    pub fn record_samples(&mut self, samples: &[Sample]) -> Result<(), ControllerError> {
        let tx = self.write()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO latest_samples(node, vm, ts_ms, json) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(node, vm) DO UPDATE SET ts_ms = excluded.ts_ms, json = excluded.json
                 WHERE excluded.ts_ms >= latest_samples.ts_ms",
            )?;
            for s in samples {
                let vm = match s {
                    Sample::Vm(v) => v.vm.as_str(),
                    Sample::Node(_) => "",
                };
                let json = serde_json::to_string(s).map_err(|e| corrupt(e.to_string()))?;
                stmt.execute(params![s.node().as_str(), vm, s.ts_ms() as i64, json])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<NodeRecord>, ControllerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, pool FROM nodes ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        rows.map(|r| {
            let (name, pool) = r?;
            Ok(NodeRecord {
                name: parse_id(name)?,
                pool: Pool::parse(&pool).ok_or_else(|| corrupt(format!("pool `{pool}`")))?,
            })
        })
        .collect()
    }

    /// VMs, optionally of one job.
    pub fn vms(&self, job: Option<&JobId>) -> Result<Vec<VmRecord>, ControllerError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, job, node, mem_max_kib, last_migrated_ms FROM vms
             WHERE ?1 IS NULL OR job = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([job.map(|j| j.as_str())], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, Option<i64>>(4)?,
            ))
        })?;
        rows.map(|r| {
            let (vm, job, node, max, last) = r?;
            Ok(VmRecord {
                vm: parse_id(vm)?,
                job: parse_id(job)?,
                node: parse_id(node)?,
                mem_max_kib: max as u64,
                last_migrated_ms: last.map(|l| l as u64),
            })
        })
        .collect()
    }

    /// Latest samples, optionally only of the given nodes.
    pub fn latest_samples(&self) -> Result<Vec<SampleRecord>, ControllerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT node, vm, json FROM latest_samples ORDER BY node, vm")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        rows.map(|r| {
            let (node, vm, json) = r?;
            Ok(SampleRecord {
                node,
                vm: (!vm.is_empty()).then_some(vm),
                sample: serde_json::from_str(&json).map_err(|e| corrupt(e.to_string()))?,
            })
        })
        .collect()
    }

    /// The view the migration daemon's rules evaluate.
    pub fn cluster_view(&self, now_ms: u64) -> Result<ClusterView, ControllerError> {
        let mems: std::collections::HashMap<NodeName, monitor::MemInfo> = self
            .latest_samples()?
            .into_iter()
            .filter_map(|s| match s.sample {
                Sample::Node(ns) => Some((ns.node, ns.mem)),
                Sample::Vm(_) => None,
            })
            .collect();
        let nodes = self
            .nodes()?
            .into_iter()
            .map(|n| {
                let mem = mems.get(&n.name).copied();
                NodeView {
                    name: n.name,
                    pool: n.pool,
                    mem,
                }
            })
            .collect();
        let migrating = self.migrating_vms()?;
        let vms = self
            .vms(None)?
            .into_iter()
            .map(|v| VmView {
                migrating: migrating.contains(&v.vm),
                vm: v.vm,
                job: v.job,
                node: v.node,
                mem_max_kib: v.mem_max_kib,
                last_migrated_ms: v.last_migrated_ms,
            })
            .collect();
        Ok(ClusterView { now_ms, nodes, vms })
    }
}
