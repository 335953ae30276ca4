//! The attach record: what a new front-end needs to take over a job whose `vse launch` died
//! (`vse attach`). The launch writes it next to the job's state database once the VMs are
//! ordered and rewrites it as the job moves on (a rank ends, a VM migrates, a checkpoint is
//! begun); it holds the job secret, so it is the user's alone (0600, checked
//! on reading). A job that ends, by its launch or by an attach, removes it.

use super::checkpoint::{CheckpointPlan, Checkpointing};
use super::front::{MonitorRequest, RankResult};
use super::run::JobPlan;
use super::{ControlOptions, JobLayout, LaunchError, VmSlot};
use crate::ckpt::{CheckpointDir, Manifest, Schedule};
use crate::net::JobNet;
use agents::agent::{AgentConfig, HostEntry, Timing};
use agents::proto::NodeId;
use control::migrate::MigrationConfig;
use monitor::NodeName;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const FORMAT: u32 = 1;

/// Where the attach record of the job whose state database is `db` lives.
pub fn record_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".attach");
    PathBuf::from(p)
}

/// The lock one `vse attach` of the job holds.
pub(super) fn lock_path(record: &Path) -> PathBuf {
    let mut p = record.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachRecord {
    pub format: u32,
    pub job: String,
    /// The `vse launch` process that wrote it: while it lives, nobody attaches.
    pub pid: u32,
    pub secret: String,
    pub k: u32,
    pub bind: IpAddr,
    pub hosts: Vec<HostEntry>,
    /// Handshake, heartbeat and timeout, in milliseconds.
    pub timing_ms: [u64; 3],
    pub orphan_grace_ms: u64,
    /// Where every live node agent listens.
    pub directory: Vec<(NodeId, SocketAddr)>,
    pub plan: PlanRecord,
    pub monitor: Option<MonitorRecord>,
    /// The job network (the nodes tell a new front-end their VMs' relays again).
    pub net: Option<JobNet>,
    /// Every rank, where it runs now and how it ended.
    pub ranks: Vec<RankResult>,
    /// The job's checkpointing: a new front-end goes on with it (a policy's walltime rule
    /// holds for the whole job, not only while its first front-end lives).
    pub checkpoint: Option<CheckpointRecord>,
    /// The ranks' barrier connections, by VM: a new front-end's barrier server hears them.
    #[serde(default)]
    pub barrier: std::collections::BTreeMap<String, Vec<crate::wire::BarrierConn>>,
}

/// [`Checkpointing`] as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub dir: PathBuf,
    /// When the allocation ends, in milliseconds since the epoch, if known.
    pub end_unix_ms: Option<u64>,
    pub at_walltime_end: bool,
    pub every_ms: Option<u64>,
    pub keep: usize,
    pub on_term: bool,
    pub memory_bytes: u64,
    /// The next checkpoint's message id: a new front-end's never meets one a node may still
    /// wait on from the old.
    pub next_id: u64,
    pub base: Manifest,
}

impl CheckpointRecord {
    pub fn of(p: &CheckpointPlan, ck: &Checkpointing, memory_bytes: u64) -> Self {
        let now = (Instant::now(), SystemTime::now());
        let end_unix_ms = p.end.map(|end| {
            let at = now.1 + end.saturating_duration_since(now.0);
            at.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        });
        Self {
            dir: p.dir.clone(),
            end_unix_ms,
            at_walltime_end: p.at_walltime_end,
            every_ms: p.every.map(|d| d.as_millis() as u64),
            keep: p.keep,
            on_term: p.on_term,
            memory_bytes,
            next_id: ck.next_id,
            base: ck.base.clone(),
        }
    }

    /// The job's checkpointing, for a new front-end.
    pub fn resume(&self) -> Result<Checkpointing, String> {
        let end = self.end_unix_ms.map(|ms| {
            let at = UNIX_EPOCH + Duration::from_millis(ms);
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            Instant::now() + left
        });
        let every = self.every_ms.map(Duration::from_millis);
        Ok(Checkpointing {
            dir: CheckpointDir::create(&self.dir).map_err(|e| e.to_string())?,
            schedule: Schedule::new(end, self.at_walltime_end, every, self.memory_bytes),
            keep: self.keep,
            on_term: self.on_term,
            next_id: self.next_id,
            base: self.base.clone(),
        })
    }
}

/// The job's placement ([`JobPlan`]) as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRecord {
    pub agents: u32,
    pub slots: Vec<VmSlot>,
    pub vm_names: Vec<String>,
    pub hostnames: Vec<String>,
    pub names: Vec<NodeName>,
    pub layout: Option<JobLayout>,
    pub mpi: bool,
}

/// The job's monitoring and migration settings ([`MonitorRequest`]) as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MonitorRecord {
    pub period_ms: u64,
    pub node_memory_mib: Option<u64>,
    pub db: PathBuf,
    pub hook: Option<Vec<String>>,
    pub prom: Option<PathBuf>,
    pub migration: Option<MigrationConfig>,
}

impl AttachRecord {
    pub fn new(
        job: &str,
        cfg: &AgentConfig,
        plan: &JobPlan,
        monitor: Option<&MonitorRequest>,
    ) -> Self {
        let t = cfg.timing;
        let ms = |d: Duration| d.as_millis() as u64;
        Self {
            format: FORMAT,
            job: job.to_string(),
            pid: std::process::id(),
            secret: cfg.secret.to_hex(),
            k: cfg.tree.k(),
            bind: cfg.bind,
            hosts: cfg.hosts.to_vec(),
            timing_ms: [ms(t.handshake), ms(t.heartbeat), ms(t.timeout)],
            orphan_grace_ms: ms(cfg.orphan_grace),
            directory: Vec::new(),
            barrier: Default::default(),
            plan: PlanRecord {
                agents: plan.agents,
                slots: plan.slots.clone(),
                vm_names: plan.vm_names.clone(),
                hostnames: plan.hostnames.clone(),
                names: plan.names.clone(),
                layout: plan.layout.clone(),
                mpi: plan.mpi,
            },
            monitor: monitor.map(|m| MonitorRecord {
                period_ms: ms(m.period),
                node_memory_mib: m.node_memory_mib,
                db: m.control.db.clone(),
                hook: m.control.hook.clone(),
                prom: m.control.prom.clone(),
                migration: m.migration.clone(),
            }),
            net: None,
            ranks: Vec::new(),
            checkpoint: None,
        }
    }

    /// The agent configuration of a new front-end (`spawner` starts no agent: they run).
    pub fn agent_config(
        &self,
        spawner: agents::agent::SharedSpawner,
    ) -> Result<AgentConfig, LaunchError> {
        let secret = agents::secret::JobSecret::from_hex(&self.secret)
            .map_err(|e| LaunchError::Attach(format!("attach record: job secret: {e}")))?;
        let [handshake, heartbeat, timeout] = self.timing_ms.map(Duration::from_millis);
        Ok(AgentConfig {
            id: NodeId(0),
            tree: agents::topo::Tree::new(self.hosts.len() as u32 + 1, self.k),
            secret,
            bind: self.bind,
            hosts: Arc::new(self.hosts.clone()),
            timing: Timing {
                handshake,
                heartbeat,
                timeout,
            },
            on_failure: agents::agent::OnFailure::Abort,
            overlay: true,
            spawner,
            orphan_grace: Duration::from_millis(self.orphan_grace_ms),
        })
    }

    pub fn plan(&self) -> JobPlan {
        let p = &self.plan;
        JobPlan {
            agents: p.agents,
            hosts: Arc::new(self.hosts.clone()),
            slots: p.slots.clone(),
            vm_names: p.vm_names.clone(),
            hostnames: p.hostnames.clone(),
            names: p.names.clone(),
            layout: p.layout.clone(),
            mpi: p.mpi,
        }
    }

    pub fn monitor(&self) -> Option<MonitorRequest> {
        self.monitor.as_ref().map(|m| MonitorRequest {
            period: Duration::from_millis(m.period_ms),
            node_memory_mib: m.node_memory_mib,
            control: ControlOptions {
                db: m.db.clone(),
                hook: m.hook.clone(),
                prom: m.prom.clone(),
            },
            migration: m.migration.clone(),
        })
    }
}

/// The record on disk, rewritten whole (a new file renamed over the old) at every change.
pub struct RecordFile {
    pub path: PathBuf,
    pub rec: AttachRecord,
}

impl RecordFile {
    pub fn create(path: PathBuf, rec: AttachRecord) -> Result<Self, String> {
        let f = Self { path, rec };
        f.save()?;
        Ok(f)
    }

    /// Reads the record of a job, refusing one that others could read or have written.
    pub fn load(path: &Path) -> Result<Self, LaunchError> {
        let bad = |why: String| LaunchError::Attach(format!("{}: {why}", path.display()));
        let meta = std::fs::symlink_metadata(path).map_err(|e| {
            bad(format!(
                "{e}; hint: the job has ended, was launched before `vse attach` existed, or uses another --db"
            ))
        })?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
            return Err(bad(
                "not a regular file of yours with mode 0600: refused (it holds the job's secret)"
                    .into(),
            ));
        }
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let rec: AttachRecord =
            serde_json::from_slice(&text).map_err(|e| bad(format!("unreadable: {e}")))?;
        if rec.format != FORMAT {
            return Err(bad(format!(
                "format {} (this vse reads {FORMAT}): attach with the vse that launched the job",
                rec.format
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            rec,
        })
    }

    pub fn save(&self) -> Result<(), String> {
        let text = serde_json::to_vec(&self.rec).map_err(|e| e.to_string())?;
        let tmp = self
            .path
            .with_extension(format!("tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&text)?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", self.path.display())
        })
    }

    /// Rewrites the record after `change`; a record that cannot be written is said once on
    /// stderr (an attach would then start from an older view).
    pub fn update(&mut self, change: impl FnOnce(&mut AttachRecord)) {
        change(&mut self.rec);
        if let Err(e) = self.save() {
            eprintln!("vse: attach record: {e}");
        }
    }

    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(lock_path(&self.path));
    }
}

/// Whether process `pid` is alive and is a vse (a recycled pid of another program is not the
/// job's launch).
pub fn launch_alive(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let zombie = status
        .lines()
        .any(|l| l.starts_with("State:") && l.contains('Z'));
    exe.is_ok_and(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vse"))
    }) && !zombie
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AttachRecord {
        let text = serde_json::json!({
            "format": FORMAT, "job": "j1", "pid": 1, "secret": "00".repeat(32), "k": 2,
            "bind": "127.0.0.1", "hosts": [{"host": "n1", "addr": "127.0.0.1"}],
            "timing_ms": [1000, 100, 500], "orphan_grace_ms": 60000,
            "directory": [[1, "127.0.0.1:4000"]],
            "plan": {"agents": 1, "slots": [], "vm_names": [], "hostnames": [], "names": [],
                     "layout": null, "mpi": false},
            "monitor": null, "net": null, "ranks": [], "checkpoint": null,
        });
        serde_json::from_value(text).unwrap()
    }

    #[test]
    fn a_record_is_read_back_only_when_private_and_of_this_format() {
        let d = tempfile::tempdir().unwrap();
        let path = record_path(&d.path().join("j1.state.db"));
        let f = RecordFile::create(path.clone(), record()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = RecordFile::load(&path).unwrap();
        assert_eq!(back.rec.directory, f.rec.directory);
        assert_eq!(
            back.rec.agent_config(test_spawner()).unwrap().tree.size(),
            2
        );

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = RecordFile::load(&path).err().unwrap().to_string();
        assert!(e.contains("0600"), "{e}");

        let mut old = record();
        old.format = FORMAT + 1;
        std::fs::remove_file(&path).unwrap();
        RecordFile::create(path.clone(), old).unwrap();
        let e = RecordFile::load(&path).err().unwrap().to_string();
        assert!(
            e.contains("attach with the vse that launched the job"),
            "{e}"
        );

        f.remove();
        let e = RecordFile::load(&path).err().unwrap().to_string();
        assert!(e.contains("the job has ended"), "{e}");
    }

    fn test_spawner() -> agents::agent::SharedSpawner {
        Arc::new(agents::agent::ProcessSpawner {
            exe: "/bin/false".into(),
            remote: agents::agent::Remote::Direct,
        })
    }
}
