//! The front-end of `vse launch`: bootstrap the agents, stage the image to every node, order
//! each node's VMs, relay rank output and statuses, and tear the job down whatever happens.

use super::checkpoint::{CheckpointPlan, Taken};
use super::control::{ControlOptions, ControlSummary, Controller, JobLayout, MigrationSetup};
use super::migrator::{OverlayMigrator, Report};
use super::relay::{BarrierHub, Owners};
use super::run::JobPlan;
use super::{LaunchError, job_status};
use crate::{
    net::{JobNet, Switch, SwitchStats},
    stage::{StageOptions, StageSummary},
    wire::{BarrierMsg, MonitorMsg, Stream, Wire},
};
use agents::{
    agent::{AgentConfig, Control, Failure},
    proto::NodeId,
};
use control::migrate::{BarrierServer, MigrationConfig};
use monitor::{NodeName, Sample};

type Event = agents::agent::Event<Wire>;
type Job = agents::agent::Job<Wire>;
use std::{path::PathBuf, sync::Arc, time::Duration};
use vse_exit::Exit;

#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub image: PathBuf,
    pub argv: Vec<String>,
    pub vms_per_node: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub vms_per_core: u32,
    /// The V2M plugin the nodes use; `None`: each node's first available one.
    pub hypervisor: Option<v2m::PluginKind>,
    /// Prefix of the VM names (unique per job on a machine).
    pub job_name: String,
    /// Cores of each node, in agent order (agent i+1 runs on node i).
    pub cpus: Vec<u32>,
    /// All agents run on this one machine (`local:N`): they share its cores.
    pub shared_machine: bool,
    pub stage: StageOptions,
    /// The job's VM network (segment base and prefix length), or none: VMs without a NIC.
    pub network: Option<(std::net::Ipv4Addr, u8)>,
    /// Run `argv` under mpirun in rank 0's VM (needs `network`); the job's status is
    /// mpirun's.
    pub mpi: bool,
    /// The last N nodes get no VM: the free pool migrations go to.
    pub spare_nodes: u32,
    /// Sampling on every node and the controller on the front-end.
    pub monitor: Option<MonitorRequest>,
    /// The guests' hostnames when a policy sets them; else each VM is called by its name.
    pub hostnames: Option<Hostnames>,
    /// Checkpoints of the job (`--checkpoint-dir`) and when to take them.
    pub checkpoint: Option<CheckpointPlan>,
    /// Resume this verified checkpoint instead of starting the command: its VMs are
    /// restored and their running commands adopted.
    pub restore: Option<crate::ckpt::Checkpoint>,
    /// Nodes may start VMs from their boot templates of the image (and save one after a
    /// cold boot): the policies' `images.boot_templates` and `--no-template`.
    pub boot_templates: bool,
    /// The bounds of every node's image cache (`cache.max_size`, `cache.max_age`).
    pub cache: vse_base::evict::Limits,
    /// Run the command as the guest's root instead of the job's user (`--guest-root`, which
    /// the caller checked against `users.allow_root`).
    pub guest_root: bool,
    /// Forward this process's standard input to rank 0's command (not for a restored job,
    /// whose command has read what it read).
    pub stdin: bool,
    /// Host directories every VM mounts (resolved on this host, as the user).
    pub shares: Vec<vse_guest_agent::share::server::Shared>,
    /// Where the command starts in the guest (the launch directory, when a share holds it).
    pub cwd: Option<String>,
    /// Where the job's checkpoints and migrations are recorded before they start.
    pub audit: Option<vse_audit::Auditor>,
}

/// A policy's hostname pattern (`network.hostname`) and the batch job its `{job}` stands for.
#[derive(Debug, Clone)]
pub struct Hostnames {
    pub pattern: vsec::units::HostnamePattern,
    pub job: String,
}

/// Monitoring of the job: node agents sample, the front-end's controller records.
#[derive(Debug, Clone)]
pub struct MonitorRequest {
    pub period: Duration,
    /// Simulation mode for agents sharing one machine: each node's VMs run in a memory
    /// cgroup of this size, whose view stands for the node's `/proc/meminfo`.
    pub node_memory_mib: Option<u64>,
    pub control: ControlOptions,
    /// The migration daemon's settings, when the policies enable a rule.
    pub migration: Option<MigrationConfig>,
}

/// What the caller shows while the job runs.
#[derive(Debug, Clone)]
pub enum LaunchEvent {
    Phase(String),
    Output {
        rank: u32,
        stream: Stream,
        text: String,
    },
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RankResult {
    pub rank: u32,
    pub node: NodeId,
    pub host: String,
    pub vm: String,
    pub cpus: Vec<usize>,
    pub status: Option<i32>,
    pub error: Option<String>,
    /// Where the rank's time went on its node (from a rank that ran to its end there).
    #[serde(default)]
    pub times: Option<crate::wire::RankTimes>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LaunchReport {
    pub exit_code: u8,
    /// Why the job ended ("completed" or what failed).
    pub reason: String,
    pub ranks: Vec<RankResult>,
    pub staging: Option<StageSummary>,
    pub failures: Vec<Failure>,
    /// What the job's switch forwarded and dropped (when the job had a network).
    pub network: Option<SwitchStats>,
    /// The controller's node name of each agent, in agent order (agent i+1 is entry i).
    pub nodes: Vec<String>,
    pub monitor: Option<ControlSummary>,
    /// When each phase of the launch began, in milliseconds from its start: where the time
    /// goes.
    pub timeline: Vec<Mark>,
    /// The checkpoints this launch took.
    pub checkpoints: Vec<Taken>,
    /// The checkpoint this launch resumed from.
    pub restored: Option<PathBuf>,
}

/// A phase of the launch and when it began (ms since the launch started).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Mark {
    pub phase: &'static str,
    pub at_ms: u64,
}

/// Runs the whole job on a runtime of its own.
pub fn launch_blocking(
    cfg: AgentConfig,
    req: LaunchRequest,
    on: impl FnMut(LaunchEvent) + Send,
) -> Result<LaunchReport, LaunchError> {
    runtime()?.block_on(launch(cfg, req, on))
}

/// The front-end's runtime: two workers are plenty for a job's messages.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, LaunchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LaunchError::Runtime(e.to_string()))
}

pub(super) struct Front<F> {
    pub(super) job: Job,
    pub(super) on: F,
    pub(super) failures: Vec<Failure>,
    pub(super) control: Option<Controller>,
    pub(super) names: Vec<NodeName>,
    pub(super) hub: Option<BarrierHub>,
    /// The barrier server (shared with the migration daemon): checkpoints of an MPI job
    /// hold its ranks at a barrier through it.
    pub(super) barrier: Option<Arc<BarrierServer>>,
    pub(super) reports: Option<std::sync::mpsc::Sender<Report>>,
    pub(super) owners: Owners,
    /// Private (0700) directory of the barrier server's socket; removed at the end.
    pub(super) private: Option<PathBuf>,
    pub(super) started: std::time::Instant,
    pub(super) timeline: Vec<Mark>,
    /// What `vse attach` needs should this process die (when the job may outlive it).
    pub(super) record: Option<super::attach::RecordFile>,
    /// Acknowledgements for the forwarder of this process's standard input to rank 0.
    pub(super) stdin_taken: Option<std::sync::mpsc::Sender<u64>>,
    /// The job's audit trail: its checkpoints and migrations.
    pub(super) audit: Option<super::audit::JobAudit>,
}

/// Why a job ended before its ranks did.
#[derive(Debug, thiserror::Error)]
pub(super) enum Ended {
    #[error("{node} failed ({reason}, seen by {by})")]
    NodeFailed {
        node: NodeId,
        by: NodeId,
        reason: String,
    },
    #[error("{0}")]
    ShuttingDown(String),
    #[error("the front-end agent ended")]
    FrontEnd,
    #[error(
        "checkpointed to {} ({}) and stopped; hint: run the same command again to resume it (or add `--restore {}` to it to resume from this checkpoint)",
        .0.path.display(), .0.reason.as_str(), .0.path.display()
    )]
    Checkpointed(Taken),
    #[error("terminated by the batch system (SIGTERM){0}")]
    Terminated(String),
}

impl<F: FnMut(LaunchEvent)> Front<F> {
    pub(super) fn new(job: Job, on: F, names: Vec<NodeName>, owners: Owners) -> Self {
        Front {
            job,
            on,
            failures: Vec::new(),
            control: None,
            names,
            hub: None,
            barrier: None,
            reports: None,
            owners,
            private: None,
            started: std::time::Instant::now(),
            timeline: Vec::new(),
            record: None,
            stdin_taken: None,
            audit: None,
        }
    }

    /// Next event that matters, or why the job ended (an agent failed, the front-end ended).
    pub(super) async fn next(&mut self, within: Option<Duration>) -> Result<Option<Event>, Ended> {
        let e = match within {
            Some(d) => match tokio::time::timeout(d, self.job.next_event()).await {
                Ok(e) => e,
                Err(_) => return Ok(None),
            },
            None => self.job.next_event().await,
        };
        match e {
            Some(Event::NodeFailed { node, by, reason }) => {
                self.failures.push(Failure {
                    node,
                    by,
                    reason: reason.clone(),
                });
                Err(Ended::NodeFailed { node, by, reason })
            }
            Some(Event::ShuttingDown { reason }) => Err(Ended::ShuttingDown(reason)),
            Some(e) => Ok(Some(e)),
            None => Err(Ended::FrontEnd),
        }
    }

    pub(super) async fn finish(mut self, mut report: LaunchReport) -> LaunchReport {
        self.job.control(Control::Shutdown {
            reason: report.reason.clone(),
        });
        while self.job.next_event().await.is_some() {}
        if let Ok(exit) = self.job.wait().await {
            self.failures.extend(exit.failures);
        }
        self.failures.sort_by_key(|f| f.node);
        self.failures.dedup_by_key(|f| f.node);
        report.failures = self.failures;
        report.nodes = self.names.iter().map(|n| n.to_string()).collect();
        self.hub = None;
        self.barrier = None;
        report.monitor = self.control.take().map(Controller::finish);
        if let Some(d) = self.private.take() {
            let _ = std::fs::remove_dir_all(d);
        }
        // The job is over: nothing is left to attach to.
        if let Some(r) = self.record.take() {
            r.remove();
        }
        // `self.job` is spent: the last mark by hand.
        let at_ms = self.started.elapsed().as_millis() as u64;
        self.timeline.push(Mark {
            phase: "done",
            at_ms,
        });
        report.timeline = self.timeline;
        report
    }

    /// Notes that `phase` begins now (once: the first time counts).
    pub(super) fn mark(&mut self, phase: &'static str) {
        if self.timeline.iter().all(|m| m.phase != phase) {
            let at_ms = self.started.elapsed().as_millis() as u64;
            self.timeline.push(Mark { phase, at_ms });
        }
    }

    /// Builds the controller (and the migration daemon's pieces) once the agents' job exists;
    /// an MPI job or one that may migrate gets the barrier server its ranks' hook talks to.
    pub(super) fn control(
        &mut self,
        m: &MonitorRequest,
        layout: &JobLayout,
        mpi: bool,
        recover: Option<&mut dyn control::state::VmLocator>,
    ) -> Result<(), LaunchError> {
        let bad = |e: String| LaunchError::Monitor(e);
        let server = match m.migration.is_some() || mpi {
            true => Some(self.barrier_server(layout).map_err(bad)?),
            false => None,
        };
        let setup = match (&m.migration, server) {
            (Some(cfg), Some(server)) => {
                let (tx, rx) = std::sync::mpsc::channel();
                self.reports = Some(tx);
                let ids = self
                    .names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.clone(), NodeId(i as u32 + 1)))
                    .collect();
                Some(MigrationSetup {
                    cfg: cfg.clone(),
                    period: m.period,
                    server,
                    migrator: OverlayMigrator {
                        h: self.job.handle(),
                        ids,
                        owners: self.owners.clone(),
                        reports: rx,
                        timeout: Duration::from_secs(600),
                        params: migration_params(cfg),
                        last: None,
                        prepared: Default::default(),
                        early: Default::default(),
                        audit: self.audit.clone(),
                    },
                })
            }
            _ => None,
        };
        let c = match recover {
            Some(l) => Controller::resume(m.control.clone(), layout, m.period, setup, l),
            None => Controller::start(m.control.clone(), layout, m.period, setup),
        };
        self.control = Some(c.map_err(|e| bad(e.to_string()))?);
        Ok(())
    }

    /// The barrier server, on a socket in a private (0700) directory, and the hub that
    /// relays the ranks' lines to it.
    fn barrier_server(&mut self, layout: &JobLayout) -> Result<Arc<BarrierServer>, String> {
        super::sweep::dead_front_ends(&std::env::temp_dir());
        let dir =
            std::env::temp_dir().join(format!("vse-ctl-{}-{}", layout.job, std::process::id()));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        self.private = Some(dir.clone());
        let sock = dir.join("barrier.sock");
        let server = Arc::new(BarrierServer::bind(&sock).map_err(|e| e.to_string())?);
        self.hub = Some(BarrierHub::new(
            sock,
            self.owners.clone(),
            self.job.handle(),
            layout.job.clone(),
        ));
        self.barrier = Some(server.clone());
        Ok(server)
    }

    /// Monitoring traffic from node `from`; true if the message was one.
    pub(super) fn monitoring(&mut self, from: NodeId, msg: &Wire) -> bool {
        let Some(c) = &self.control else {
            return matches!(
                msg,
                Wire::Monitor(MonitorMsg::Samples { .. })
                    | Wire::Monitor(MonitorMsg::Failed { .. })
            );
        };
        let Some(name) = self.names.get(from.0 as usize - 1) else {
            return false;
        };
        match msg {
            Wire::Monitor(MonitorMsg::Samples { samples }) => {
                // A node reports for itself only: foreign tags are dropped, not trusted.
                let own: Vec<Sample> = samples
                    .iter()
                    .filter(|s| s.node() == name)
                    .cloned()
                    .collect();
                if own.len() != samples.len() {
                    c.error(format!(
                        "{from} ({name}) sent samples tagged with another node"
                    ));
                }
                c.samples(own);
                true
            }
            Wire::Monitor(MonitorMsg::Failed { reason }) => {
                c.error(format!("{name}: {reason}"));
                true
            }
            Wire::Barrier(BarrierMsg::Up { vm, conn, line }) => {
                if let Some(hub) = self.hub.as_mut() {
                    let before = hub.conns(vm).len();
                    hub.up(from, vm, *conn, line);
                    self.record_conns(vm, before);
                }
                true
            }
            Wire::Barrier(BarrierMsg::UpClosed { vm, conn }) => {
                if let Some(hub) = self.hub.as_mut() {
                    let before = hub.conns(vm).len();
                    hub.closed(from, vm, *conn);
                    self.record_conns(vm, before);
                }
                true
            }
            _ => false,
        }
    }
}

impl<F> Front<F> {
    /// Keeps `vm`'s barrier connections in the attach record when they changed: a new
    /// front-end introduces them to its barrier server.
    fn record_conns(&mut self, vm: &str, before: usize) {
        let (Some(hub), Some(rec)) = (&self.hub, self.record.as_mut()) else {
            return;
        };
        let now = hub.conns(vm);
        if now.len() != before {
            rec.update(|a| {
                a.barrier.insert(vm.to_string(), now);
            });
        }
    }
}

/// The report of a launch that ended with `code`: a job status, or an [`Exit`] code.
pub(super) fn report(code: u8, reason: String) -> LaunchReport {
    LaunchReport {
        exit_code: code,
        reason,
        ranks: Vec::new(),
        staging: None,
        failures: Vec::new(),
        network: None,
        nodes: Vec::new(),
        monitor: None,
        timeline: Vec::new(),
        checkpoints: Vec::new(),
        restored: None,
    }
}

/// Controller names of the nodes: the hosts when they are distinct, else host and agent
/// number (agents sharing one machine).
pub(super) fn node_names(hosts: &[String]) -> Result<Vec<NodeName>, LaunchError> {
    let distinct = hosts.iter().collect::<std::collections::HashSet<_>>().len() == hosts.len();
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let name = if distinct {
                h.clone()
            } else {
                format!("{h}-{}", i + 1)
            };
            NodeName::new(name).map_err(|e| LaunchError::Monitor(e.to_string()))
        })
        .collect()
}

async fn launch(
    cfg: AgentConfig,
    req: LaunchRequest,
    on: impl FnMut(LaunchEvent),
) -> Result<LaunchReport, LaunchError> {
    // Refuse an impossible placement before starting anything.
    let plan = JobPlan::new(&cfg, &req)?;
    let (n, k, secret, front_ip) = (plan.agents, cfg.tree.k(), cfg.secret.clone(), cfg.bind);
    let mut record = (!cfg.orphan_grace.is_zero()).then(|| {
        super::attach::AttachRecord::new(&req.job_name, &cfg, &plan, req.monitor.as_ref())
    });
    let mut f = Front::new(Job::start(cfg), on, plan.names.clone(), plan.owners());
    f.audit = (req.audit.clone()).map(|a| super::audit::JobAudit::new(a, &req.job_name));
    if let (Some(m), Some(layout)) = (&req.monitor, &plan.layout)
        && let Err(e) = f.control(m, layout, req.mpi, None)
    {
        let _ = f
            .finish(report(Exit::NodeFailed.code(), e.to_string()))
            .await;
        return Err(e);
    }
    f.mark("agents");
    (f.on)(LaunchEvent::Phase(format!("starting {n} agent(s)")));
    let directory = match f.ready().await {
        Ok(d) => d,
        Err(r) => {
            return Ok(f
                .finish(report(Exit::NodeFailed.code(), r.to_string()))
                .await);
        }
    };
    f.mark("staging");
    (f.on)(LaunchEvent::Phase("staging the image".into()));
    let summary = match f.stage(&req.image, n, k, &secret, req.stage).await {
        Ok(s) => s,
        Err(rep) => return Ok(f.finish(*rep).await),
    };
    if let Some(m) = &req.monitor {
        f.start_monitoring(m, &req.job_name, n);
    }
    let size = plan.size();
    f.mark("booting");
    (f.on)(LaunchEvent::Phase(format!(
        "booting {size} VM(s) on {n} node(s)"
    )));
    // The switch lives as long as this function: every VM is gone before it stops.
    let key = crate::net::NetKey::derive(&secret);
    let (switch, net) = match job_network(req.network, front_ip, key, size) {
        Ok(x) => x,
        Err(e) => {
            let mut rep = report(Exit::VmFailed.code(), format!("job network: {e}"));
            rep.staging = Some(summary);
            return Ok(f.finish(rep).await);
        }
    };
    if let Some(r) = &req.restore
        && let Err(e) = super::restore::matches(r, &summary.digest, &plan)
    {
        let mut rep = report(Exit::InvalidInput.code(), e);
        rep.staging = Some(summary);
        return Ok(f.finish(rep).await);
    }
    let mut ck = match super::restore::checkpointing(&req, &plan, &summary.digest) {
        Ok(ck) => ck,
        Err(e) => {
            let mut rep = report(Exit::InvalidInput.code(), e);
            rep.staging = Some(summary);
            return Ok(f.finish(rep).await);
        }
    };
    if let (Some(r), Some(hub)) = (&req.restore, f.hub.as_mut()) {
        super::restore::barrier_conns(&r.manifest, hub);
    }
    f.order_vms(&req, &plan, &summary.digest, net.clone());
    let mut ranks = plan.ranks();
    if let Some(r) = &req.restore {
        super::restore::ended_ranks(&r.manifest, &mut ranks);
    }
    if let (Some(mut rec), Some(m)) = (record.take(), &req.monitor) {
        rec.directory = directory;
        rec.net.clone_from(&net);
        rec.ranks.clone_from(&ranks);
        if let (Some(p), Some(c)) = (&req.checkpoint, &ck) {
            let memory = u64::from(plan.size()) * (req.memory_mib << 20);
            rec.checkpoint = Some(super::attach::CheckpointRecord::of(p, c, memory));
        }
        let path = super::attach::record_path(&m.control.db);
        match super::attach::RecordFile::create(path, rec) {
            Ok(r) => f.record = Some(r),
            Err(e) => eprintln!("vse launch: no attach record, `vse attach` will not work: {e}"),
        }
    }
    let mut taken = Vec::new();
    let mut asked = (req.monitor.as_ref())
        .and_then(|m| super::wake::Requests::open(&m.control.db, &req.job_name));
    let ended = f
        .collect(
            &plan,
            &mut ranks,
            (switch.as_ref(), net.as_ref()),
            ck.as_mut(),
            &mut taken,
            asked.as_mut(),
        )
        .await;
    f.mark("teardown");
    if let (None, Some(ck)) = (&ended, &ck)
        && !ranks.iter().any(|r| r.error.is_some())
    {
        // A finished job is not resumed: its command line, run again, starts afresh.
        let _ = ck.dir.retire();
    }
    let (code, reason) = outcome(&ranks, ended, req.mpi);
    let mut rep = report(code, reason);
    rep.ranks = ranks;
    rep.staging = Some(summary);
    rep.checkpoints = taken;
    rep.restored = req.restore.as_ref().map(|r| r.dir.clone());
    let mut rep = f.finish(rep).await;
    rep.network = switch.map(|s| s.stats());
    Ok(rep)
}

/// The job's network: its switch on the front-end's address and the addresses of its ranks.
fn job_network(
    network: Option<(std::net::Ipv4Addr, u8)>,
    front_ip: std::net::IpAddr,
    key: crate::net::NetKey,
    size: u32,
) -> Result<(Option<Switch>, Option<JobNet>), crate::net::NetError> {
    let Some((base, prefix)) = network else {
        return Ok((None, None));
    };
    let sw = Switch::start(front_ip, key)?;
    let net = JobNet::new(base, prefix, sw.addr(), size)?;
    Ok((Some(sw), Some(net)))
}

/// The job's exit code and why, from its ranks (under `--mpi`, rank 0's mpirun).
pub(super) fn outcome(ranks: &[RankResult], ended: Option<Ended>, mpi: bool) -> (u8, String) {
    match ended {
        Some(r @ Ended::Checkpointed(_)) => (Exit::Checkpointed.code(), r.to_string()),
        // The shell's code of a process SIGTERM ended.
        Some(r @ Ended::Terminated(_)) => (143, r.to_string()),
        Some(r) => (Exit::NodeFailed.code(), r.to_string()),
        None if ranks.iter().any(|r| r.error.is_some()) => (
            Exit::VmFailed.code(),
            "a VM could not run the command".to_string(),
        ),
        None => {
            let st: Vec<(u32, i32)> = ranks
                .iter()
                .take(if mpi { 1 } else { ranks.len() })
                .map(|r| (r.rank, r.status.unwrap_or(-1)))
                .collect();
            (job_status(&st), "completed".to_string())
        }
    }
}

/// What every live migration is given: the policy's transfer limits.
fn migration_params(cfg: &MigrationConfig) -> v2m::MigrationParams {
    let t = &cfg.transfer;
    v2m::MigrationParams {
        max_bandwidth_bytes_per_s: t.max_bandwidth_bytes_per_s,
        downtime_limit_ms: t.downtime_limit_ms,
        timeout: std::time::Duration::from_secs(t.timeout_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_hosts_unless_agents_share_one() {
        let n = |v: &[&str]| {
            node_names(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|v| v.into_iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(n(&["n1", "n2"]).unwrap(), vec!["n1", "n2"]);
        assert_eq!(
            n(&["localhost", "localhost"]).unwrap(),
            vec!["localhost-1", "localhost-2"]
        );
        assert!(matches!(n(&["bad host"]), Err(LaunchError::Monitor(_))));
    }
}
