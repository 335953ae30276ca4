//! The controller of a running job, on the front-end: the node agents' samples arrive over
//! the authenticated overlay and are written to the state database (job → VM → node mapping,
//! pools, latest samples), fed to the monitoring hook and exported for dashboards. It runs on
//! a thread of its own so SQLite's fsyncs and a slow hook never stall the overlay.

use super::migrator::OverlayMigrator;
use control::migrate::{
    AckOutcome, BarrierConfig, BarrierServer, Daemon, EvacuateError, MigrationConfig, Outcome,
    evacuation_plan, run_plan,
};
use control::model::Pool;
use control::state::{ControllerError, MigrationState, RequestRecord, RequestState, StateDb};
use monitor::{CommandHook, JobId, MonitorError, NodeName, Sample, VmId, prometheus_text};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

/// Where the controller keeps and sends what it learns.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// The state database (created if missing).
    pub db: PathBuf,
    /// Program and arguments of the monitoring hook: it gets every sample as a JSON line.
    pub hook: Option<Vec<String>>,
    /// Prometheus text file, rewritten (atomically) with the latest samples of every series.
    pub prom: Option<PathBuf>,
}

/// The job as placed: its nodes (spares included) and each VM's node and memory maximum.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobLayout {
    pub job: JobId,
    pub nodes: Vec<NodeName>,
    pub vms: Vec<(VmId, NodeName, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    State(#[from] ControllerError),
    #[error(transparent)]
    Monitor(#[from] MonitorError),
    #[error("--monitor-hook: empty command")]
    EmptyHook,
    #[error("migration settings: {0}")]
    Migration(#[source] control::migrate::ConfigError),
}

/// The migration daemon of the job (when the policies enable a rule): it evaluates its rules
/// once per `period` and runs each plan with the barrier protocol through `server`.
pub struct MigrationSetup {
    pub cfg: MigrationConfig,
    pub period: Duration,
    pub server: std::sync::Arc<BarrierServer>,
    pub migrator: OverlayMigrator,
}

struct Migrating {
    daemon: Daemon,
    barrier: BarrierConfig,
    period: Duration,
    last: Option<Instant>,
    server: std::sync::Arc<BarrierServer>,
    migrator: OverlayMigrator,
    /// Sources whose last plan failed, left alone until then: a destination or hypervisor
    /// that cannot take the VM would otherwise be retried every round.
    backoff: HashMap<NodeName, Instant>,
}

/// How long a source whose migration failed is left alone.
const FAILED_BACKOFF: Duration = Duration::from_secs(60);

/// What the controller did, for the job's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ControlSummary {
    pub state_db: PathBuf,
    /// Sampling rounds received from node agents, and samples in them.
    pub rounds: u64,
    pub samples: u64,
    /// Problems that did not stop the job (a dead hook, a node that cannot monitor itself).
    pub errors: Vec<String>,
    /// Whether the migration daemon ran, and what each of its plans became.
    pub daemon: bool,
    pub migrations: Vec<String>,
    /// The job's migrations as the state database has them at the end: each move's transfer
    /// (storage, bytes, QEMU's total time and downtime) and every state with its time.
    pub records: Vec<control::state::MigrationRecord>,
}

enum Input {
    Samples(Vec<Sample>),
    Error(String),
}

pub struct Controller {
    tx: Option<Sender<Input>>,
    thread: Option<std::thread::JoinHandle<ControlSummary>>,
    /// Migrations the crash recovery finished or rolled back, and how: ranks the old
    /// front-end held at a barrier for one of them still wait for that answer.
    recovered: Vec<(i64, AckOutcome)>,
}

struct Worker {
    db: StateDb,
    job: JobId,
    hook: Option<CommandHook>,
    prom: Option<PathBuf>,
    latest: BTreeMap<(String, String), Sample>,
    summary: ControlSummary,
    migrating: Option<Migrating>,
}

/// Errors kept in the summary: enough to diagnose, bounded for a long job.
const MAX_ERRORS: usize = 20;

impl Controller {
    /// Opens the database and records the job's nodes (free until they get a VM) and VMs.
    pub fn start(
        opts: ControlOptions,
        layout: &JobLayout,
        period: Duration,
        migration: Option<MigrationSetup>,
    ) -> Result<Self, ControlError> {
        Self::begin(opts, layout, period, migration, None)
    }

    /// The controller of a job taken over by a new front-end (`vse attach`): the database
    /// has the job placed already; a migration the old front-end left unfinished is finished
    /// or rolled back where `locator` finds its VMs (the library's crash recovery).
    pub fn resume(
        opts: ControlOptions,
        layout: &JobLayout,
        period: Duration,
        migration: Option<MigrationSetup>,
        locator: &mut dyn control::state::VmLocator,
    ) -> Result<Self, ControlError> {
        Self::begin(opts, layout, period, migration, Some(locator))
    }

    fn begin(
        opts: ControlOptions,
        layout: &JobLayout,
        period: Duration,
        migration: Option<MigrationSetup>,
        recover: Option<&mut dyn control::state::VmLocator>,
    ) -> Result<Self, ControlError> {
        let migrating = match migration {
            Some(m) => Some(Migrating {
                barrier: m.cfg.barrier.clone(),
                daemon: Daemon::new(m.cfg).map_err(ControlError::Migration)?,
                period: m.period,
                last: None,
                server: m.server,
                migrator: m.migrator,
                backoff: HashMap::new(),
            }),
            None => None,
        };
        if let Some(dir) = opts.db.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            vse_base::private_dir(dir, "state database directory")
                .map_err(control::state::ControllerError::from)?;
        }
        let mut db = StateDb::open(&opts.db)?;
        let recovered = match recover {
            Some(locator) => (db.recover(locator)?.into_iter())
                .map(|r| match r.now {
                    MigrationState::Done => (r.id.0, AckOutcome::Migrated),
                    _ => (r.id.0, AckOutcome::Cancelled),
                })
                .collect(),
            None => {
                for n in &layout.nodes {
                    db.upsert_node(n, Pool::Free)?;
                }
                for (vm, node, max_kib) in &layout.vms {
                    db.add_vm(&layout.job, vm, node, *max_kib)?;
                }
                Vec::new()
            }
        };
        let hook = match &opts.hook {
            Some(argv) => {
                let (prog, args) = argv.split_first().ok_or(ControlError::EmptyHook)?;
                Some(CommandHook::spawn(prog, args)?)
            }
            None => None,
        };
        let (tx, rx) = channel();
        let beat = Heartbeat::start(&opts.db, &layout.job, period)?;
        let w = Worker {
            db,
            job: layout.job.clone(),
            hook,
            prom: opts.prom.clone(),
            latest: BTreeMap::new(),
            summary: ControlSummary {
                state_db: std::path::absolute(&opts.db).unwrap_or(opts.db.clone()),
                daemon: migrating.is_some(),
                ..ControlSummary::default()
            },
            migrating,
        };
        let thread = std::thread::Builder::new()
            .name("vse-controller".into())
            .spawn(move || {
                let summary = w.run(rx);
                beat.stop();
                summary
            })
            .map_err(MonitorError::Io)?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            recovered,
        })
    }

    /// What the crash recovery did to each migration it found unfinished.
    pub fn recovered(&self) -> &[(i64, AckOutcome)] {
        &self.recovered
    }

    /// One sampling round of a node (never blocks).
    pub fn samples(&self, s: Vec<Sample>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Input::Samples(s));
        }
    }

    /// A problem worth reporting that does not end the job.
    pub fn error(&self, e: String) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Input::Error(e));
        }
    }

    /// Drains what is queued, closes the hook and returns the summary.
    pub fn finish(mut self) -> ControlSummary {
        self.tx = None;
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Tells `vse evacuate` and `vse status` that the job's controller is alive, from a thread
/// of its own: the controller may spend minutes in one migration plan (waiting for ranks to
/// reach a barrier) and is no less alive for it. Its own database connection; SQLite
/// serialises the writes.
struct Heartbeat {
    stop: Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Heartbeat {
    fn start(db: &Path, job: &JobId, period: Duration) -> Result<Self, ControlError> {
        let mut db = StateDb::open(db)?;
        db.beat(job, period.as_millis() as u64)?;
        let (stop, rx) = channel::<()>();
        let job = job.clone();
        let thread = std::thread::Builder::new()
            .name("vse-heartbeat".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(period)
                {
                    // A missed beat only makes readers wait longer: nothing to report.
                    let _ = db.beat(&job, period.as_millis() as u64);
                }
                let _ = db.end_beat(&job);
            })
            .map_err(MonitorError::Io)?;
        Ok(Self { stop, thread })
    }

    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

impl Worker {
    fn note(&mut self, e: String) {
        if self.summary.errors.len() < MAX_ERRORS && !self.summary.errors.contains(&e) {
            self.summary.errors.push(e);
        }
    }

    fn run(mut self, rx: Receiver<Input>) -> ControlSummary {
        for input in rx {
            match input {
                Input::Samples(s) => self.ingest(s),
                Input::Error(e) => self.note(e),
            }
        }
        if let Some(h) = self.hook.take()
            && let Err(e) = h.finish(Duration::from_secs(5))
        {
            self.note(e.to_string());
        }
        match self.db.migrations(Some(&self.job), false) {
            Ok(mut r) => {
                r.reverse();
                self.summary.records = r;
            }
            Err(e) => self.note(format!("reading the job's migrations: {e}")),
        }
        self.summary
    }

    fn ingest(&mut self, batch: Vec<Sample>) {
        self.summary.rounds += 1;
        self.summary.samples += batch.len() as u64;
        if let Err(e) = self.db.record_samples(&batch) {
            self.note(format!("recording samples: {e}"));
        }
        if let Some(h) = self.hook.as_mut()
            && let Err(e) = h.send(&batch)
        {
            // A dead hook is reported once and not fed again; the job goes on.
            self.hook = None;
            self.note(e.to_string());
        }
        if let Some(path) = self.prom.clone() {
            for s in batch {
                let vm = match &s {
                    Sample::Vm(v) => v.vm.to_string(),
                    Sample::Node(_) => String::new(),
                };
                self.latest.insert((s.node().to_string(), vm), s);
            }
            let all: Vec<Sample> = self.latest.values().cloned().collect();
            if let Err(e) = write_atomic(&path, prometheus_text(&all).as_bytes()) {
                self.note(format!("--export-prom {}: {e}", path.display()));
            }
        }
        self.requests();
        self.evaluate();
    }

    /// Requests other processes queued for this job (`vse evacuate`), each to its end.
    fn requests(&mut self) {
        let pending = match self.db.pending_requests(&self.job) {
            Ok(p) => p,
            Err(e) => return self.note(format!("reading requests: {e}")),
        };
        for r in pending {
            let (state, migration, note) = self.evacuate(&r);
            if let Err(e) = self.db.update_request(r.id, state, migration, &note) {
                self.note(format!("request {}: {e}", r.id));
            }
            self.summary.migrations.push(format!(
                "evacuation of {} {}: {note}",
                r.node,
                state.as_str()
            ));
        }
    }

    fn evacuate(&mut self, r: &RequestRecord) -> (RequestState, Option<i64>, String) {
        let failed = |note: String| (RequestState::Failed, None, note);
        let Some(m) = self.migrating.as_mut() else {
            return failed(
                "the job's policies allow no migration (an admin enables it with a `migration:` \
                 section)"
                    .into(),
            );
        };
        let view = match self.db.cluster_view(control::state::now_ms_u64()) {
            Ok(v) => v,
            Err(e) => return failed(format!("state database: {e}")),
        };
        let plan = match evacuation_plan(&view, &self.job, &r.node) {
            Ok(p) => p,
            Err(e @ EvacuateError::Empty { .. }) => {
                return match self.db.upsert_node(&r.node, control::model::Pool::Defunct) {
                    Ok(()) => (
                        RequestState::Done,
                        None,
                        format!("{e}; node marked defunct"),
                    ),
                    Err(e) => failed(format!("state database: {e}")),
                };
            }
            Err(e @ EvacuateError::NoSpare { .. }) => {
                return (RequestState::NoSpare, None, e.to_string());
            }
            Err(e @ EvacuateError::Busy { .. }) => return failed(e.to_string()),
        };
        let _ = self
            .db
            .update_request(r.id, RequestState::Running, None, "moving");
        let moved = plan.moves.len();
        match run_plan(&mut self.db, &m.server, &mut m.migrator, &plan, &m.barrier) {
            Ok(Outcome::Completed { id }) | Ok(Outcome::CompletedPastDeadline { id, .. }) => (
                RequestState::Done,
                Some(id.0),
                format!("moved {moved} VM(s) in migration {id}; node marked defunct"),
            ),
            Ok(Outcome::Cancelled { id, .. }) => (
                RequestState::Failed,
                Some(id.0),
                format!("the ranks did not reach a barrier in time; {id} cancelled by policy"),
            ),
            Err(e) => failed(e.to_string()),
        }
    }

    /// One round of the daemon per period (every node's batch arrives within one period).
    /// A plan runs to its end here: samples queue meanwhile and are recorded after.
    fn evaluate(&mut self) {
        let Some(m) = self.migrating.as_mut() else {
            return;
        };
        if m.last.is_some_and(|t| t.elapsed() < m.period) {
            return;
        }
        m.last = Some(Instant::now());
        let view = match self.db.cluster_view(control::state::now_ms_u64()) {
            Ok(v) => v,
            Err(e) => return self.note(format!("migration daemon: {e}")),
        };
        let mut notes = Vec::new();
        let now = Instant::now();
        m.backoff.retain(|_, until| *until > now);
        for plan in m.daemon.evaluate(&view) {
            if m.backoff.contains_key(&plan.source) {
                continue;
            }
            let what = format!(
                "{} {} -> {}: {}",
                plan.rule,
                plan.source,
                plan.moves
                    .iter()
                    .map(|mv| format!("{} to {}", mv.vm, mv.dest))
                    .collect::<Vec<_>>()
                    .join(", "),
                plan.reason
            );
            let r = run_plan(&mut self.db, &m.server, &mut m.migrator, &plan, &m.barrier);
            notes.push(match r {
                Ok(Outcome::Completed { id }) => format!("{id} completed: {what}"),
                Ok(Outcome::CompletedPastDeadline { id, late }) => format!(
                    "{id} completed past the barrier deadline ({} VM(s) late): {what}",
                    late.len()
                ),
                Ok(Outcome::Cancelled { id, .. }) => {
                    format!("{id} cancelled at the barrier deadline: {what}")
                }
                Err(e) => {
                    m.backoff
                        .insert(plan.source.clone(), Instant::now() + FAILED_BACKOFF);
                    format!("failed (next try in {FAILED_BACKOFF:?} at the earliest): {what}: {e}")
                }
            });
        }
        self.summary.migrations.extend(notes);
    }
}

/// Scrapers never see a half-written file.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor::{MemInfo, NodeSample};

    fn node(n: &str) -> NodeName {
        NodeName::new(n).unwrap()
    }

    #[test]
    fn samples_reach_db_hook_and_prometheus() {
        let d = tempfile::tempdir().unwrap();
        let hook_out = d.path().join("hook.jsonl");
        let opts = ControlOptions {
            db: d.path().join("sub/state.db"),
            hook: Some(vec![
                "sh".into(),
                "-c".into(),
                format!("cat > {}", hook_out.display()),
            ]),
            prom: Some(d.path().join("vse.prom")),
        };
        let layout = JobLayout {
            job: JobId::new("j1").unwrap(),
            nodes: vec![node("a"), node("b")],
            vms: vec![(VmId::new("j1-r0").unwrap(), node("a"), 262144)],
        };
        let c = Controller::start(opts.clone(), &layout, Duration::from_secs(1), None).unwrap();
        let s = Sample::Node(NodeSample {
            ts_ms: 5,
            job: Some(layout.job.clone()),
            node: node("b"),
            mem: MemInfo {
                total_kib: 100,
                active_kib: 10,
                available_kib: 90,
            },
            cpu: vec![0.5],
        });
        c.samples(vec![s.clone()]);
        c.error("x".into());
        c.error("x".into());
        let sum = c.finish();
        assert_eq!((sum.rounds, sum.samples), (1, 1));
        assert_eq!(sum.errors, vec!["x".to_string()]);
        let db = StateDb::open(&opts.db).unwrap();
        let pools: Vec<_> = db.nodes().unwrap().into_iter().map(|n| n.pool).collect();
        assert_eq!(pools, vec![Pool::Allocated, Pool::Free]);
        assert_eq!(db.latest_samples().unwrap()[0].sample, s);
        let hooked = std::fs::read_to_string(&hook_out).unwrap();
        assert_eq!(
            serde_json::from_str::<Sample>(hooked.trim()).unwrap(),
            s,
            "{hooked}"
        );
        let prom = std::fs::read_to_string(d.path().join("vse.prom")).unwrap();
        assert!(
            prom.contains("vse_node_mem_active_bytes{job=\"j1\",node=\"b\"} 10240 5"),
            "{prom}"
        );
    }
}
