//! The front-end's side of a job checkpoint. An MPI job's ranks first wait at their next
//! `MPI_Barrier` (the barrier server's notice, as for a migration): no application message is
//! in flight. Then every node holding a running rank pauses its VMs; once all have answered
//! no VM of the job runs (the consistent point: guest clocks and in-flight network frames
//! stand still together, and TCP in the guests retransmits whatever the switch dropped
//! meanwhile, which is all a job that misses the barrier gets). Then every node saves its
//! VMs into the checkpoint's partial directory, the front-end writes the manifest last and
//! publishes the checkpoint with one rename. The job then runs on, or stops (walltime end, preemption). A checkpoint that fails
//! anywhere is dropped whole and the VMs run on: a partial checkpoint is never published.

use super::front::{Ended, Front, LaunchEvent, RankResult};
use super::relay::BarrierHub;
use super::run::JobPlan;
use crate::ckpt::{CheckpointDir, Cut, Manifest, RankRecord, Reason, SavedVm, Schedule, manifest};
use crate::net::{JobNet, Switch};
use crate::wire::{CheckpointMsg, Wire};
use agents::proto::NodeId;
use control::migrate::AckOutcome;
use monitor::VmId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

type Event = agents::agent::Event<Wire>;

/// How long nodes may take to pause their VMs, and to save them.
const PAUSE_WITHIN: Duration = Duration::from_secs(60);
const SAVE_WITHIN: Duration = Duration::from_secs(900);
/// How long an MPI job's ranks get to reach a barrier before the checkpoint pauses them
/// wherever they are; shorter when preempted, as the batch system's grace time is.
const BARRIER_WITHIN: Duration = Duration::from_secs(10);
const BARRIER_WITHIN_PREEMPTED: Duration = Duration::from_secs(2);
/// Checkpoint notices are numbered from here, above any migration's (the state database's
/// row ids), and positive as the ranks' barrier hook requires.
const NOTICE_BASE: i64 = 1 << 40;

/// What a launch with `--checkpoint-dir` asks for.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    pub dir: PathBuf,
    /// When the allocation ends, if known.
    pub end: Option<Instant>,
    /// Checkpoint before the walltime ends (the spec's wish or a policy's rule).
    pub at_walltime_end: bool,
    /// Checkpoint this often (the spec's `periodic` interval, at least the policy's minimum).
    pub every: Option<Duration>,
    /// Complete checkpoints kept (the oldest go first).
    pub keep: usize,
    /// Checkpoint and stop when the batch system asks the job to end (SIGTERM).
    pub on_term: bool,
}

/// The job's checkpointing while its ranks run.
pub(super) struct Checkpointing {
    pub dir: CheckpointDir,
    pub schedule: Schedule,
    pub keep: usize,
    pub on_term: bool,
    pub next_id: u64,
    /// What every manifest of this job repeats.
    pub base: Manifest,
}

/// A complete checkpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Taken {
    pub path: PathBuf,
    pub seq: u64,
    pub reason: Reason,
    pub cut: Cut,
    pub bytes: u64,
    /// When it began, in ms from the launch's start (the timeline's clock).
    pub started_ms: u64,
    pub duration_ms: u64,
}

/// Why a checkpoint was not taken (the job runs on).
#[derive(Debug, thiserror::Error)]
pub(super) enum NotTaken {
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Ended(#[from] Ended),
}

impl<F: FnMut(LaunchEvent)> Front<F> {
    /// Takes one checkpoint of every running rank; the VMs run on afterwards unless
    /// `reason` stops the job.
    pub(super) async fn checkpoint(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        net: (Option<&Switch>, Option<&JobNet>),
        ck: &mut Checkpointing,
        reason: Reason,
    ) -> Result<Taken, NotTaken> {
        let started = Instant::now();
        let started_ms = self.started.elapsed().as_millis() as u64;
        let id = ck.next_id;
        ck.next_id += 1;
        if let Some(r) = self.record.as_mut() {
            r.update(|a| a.checkpoint.iter_mut().for_each(|c| c.next_id = ck.next_id));
        }
        (self.on)(LaunchEvent::Phase(format!(
            "checkpoint ({})",
            reason.as_str()
        )));
        if let Some(a) = &self.audit {
            let detail = format!(
                "checkpoint {id} ({}) into {}",
                reason.as_str(),
                ck.dir.root().display()
            );
            a.allow(vse_audit::Action::Checkpoint, detail)
                .map_err(NotTaken::Failed)?;
        }
        let partial = ck
            .dir
            .begin()
            .map_err(|e| NotTaken::Failed(e.to_string()))?;
        let within = match reason {
            Reason::Preempted => BARRIER_WITHIN_PREEMPTED,
            _ => BARRIER_WITHIN,
        };
        let cut = self.hold_at_barrier(plan, ranks, net, (id, within)).await?;
        let r = self
            .take(plan, ranks, net, ck, (id, cut, reason, started), partial)
            .await;
        // Ranks saved at the barrier stay there when the job stops: a restore releases them.
        if let (Cut::Barrier { notice }, Some(server)) = (cut, &self.barrier) {
            match &r {
                Ok(_) if reason.stops() => {}
                Ok(_) => server.ack(notice, AckOutcome::Checkpointed),
                Err(_) => server.ack(notice, AckOutcome::Cancelled),
            }
        }
        let (m, path) = r?;
        let _ = ck.dir.prune(ck.keep);
        ck.schedule.taken(reason, started, started.elapsed());
        Ok(Taken {
            path,
            seq: m.seq,
            reason,
            cut,
            bytes: m.bytes(),
            started_ms,
            duration_ms: m.duration_ms,
        })
    }

    /// Pauses and saves every VM and publishes the checkpoint; the VMs run on unless
    /// `reason` stops the job (or the checkpoint failed).
    async fn take(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        net: (Option<&Switch>, Option<&JobNet>),
        ck: &Checkpointing,
        (id, cut, reason, started): (u64, Cut, Reason, Instant),
        partial: crate::ckpt::Partial,
    ) -> Result<(Manifest, PathBuf), NotTaken> {
        let taken_ms = control::state::now_ms_u64();
        let nodes: BTreeSet<NodeId> = ranks
            .iter()
            .filter(|r| running(r))
            .map(|r| r.node)
            .collect();
        for n in &nodes {
            self.send(*n, Wire::Checkpoint(CheckpointMsg::Pause { id }));
        }
        let r = self
            .pause_and_save(
                plan,
                ranks,
                net,
                &nodes,
                (id, reason.stops()),
                partial.dir().to_path_buf(),
            )
            .await;
        let saved = match r {
            Ok(saved) => saved,
            Err(e) => {
                self.resume(&nodes, id);
                return Err(e);
            }
        };
        let mut m = ck.base.clone();
        m.seq = partial.seq();
        m.reason = reason;
        m.cut = cut;
        m.taken_ms = taken_ms;
        m.duration_ms = started.elapsed().as_millis() as u64;
        m.ranks = match records(ranks, saved, self.hub.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                self.resume(&nodes, id);
                return Err(NotTaken::Failed(e));
            }
        };
        let published = partial.publish(&m);
        if !reason.stops() || published.is_err() {
            self.resume(&nodes, id);
        }
        let path = published.map_err(|e| NotTaken::Failed(e.to_string()))?;
        Ok((m, path))
    }

    /// Holds every rank of an MPI job at its next barrier: the cut without messages in
    /// flight. `Cut::Pause` when the job has no barrier server, a migration holds a VM, or
    /// the ranks do not all arrive `within` (the notice is withdrawn, they go on).
    async fn hold_at_barrier(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        net: (Option<&Switch>, Option<&JobNet>),
        (id, within): (u64, Duration),
    ) -> Result<Cut, Ended> {
        let Some(server) = self.barrier.clone().filter(|_| plan.mpi) else {
            return Ok(Cut::Pause);
        };
        let vms: Vec<VmId> = (ranks.iter().filter(|r| running(r)))
            .filter_map(|r| VmId::new(&r.vm).ok())
            .collect();
        let notice = notice(id);
        if !server.try_post_notice(notice, &vms) {
            (self.on)(LaunchEvent::Phase(
                "a migration holds the barrier: checkpointing without it".into(),
            ));
            return Ok(Cut::Pause);
        }
        let until = Instant::now() + within;
        loop {
            if server.wait_ready(notice, &vms, Instant::now()).len() == vms.len() {
                return Ok(Cut::Barrier { notice });
            }
            let now = Instant::now();
            if now >= until {
                server.ack(notice, AckOutcome::Cancelled);
                (self.on)(LaunchEvent::Phase(format!(
                    "the ranks did not reach a barrier within {} s: checkpointing without it",
                    within.as_secs()
                )));
                return Ok(Cut::Pause);
            }
            // The ranks' barrier lines come in as messages: keep handling them.
            let step = until.min(now + Duration::from_millis(20));
            if let Err(e) = self.answer(plan, ranks, net, step).await {
                server.ack(notice, AckOutcome::Cancelled);
                return Err(e);
            }
        }
    }

    fn resume(&self, nodes: &BTreeSet<NodeId>, id: u64) {
        for n in nodes {
            self.send(*n, Wire::Checkpoint(CheckpointMsg::Resume { id }));
        }
    }

    /// Pauses every node's VMs, then has each save them into `dir`; the ranks' other
    /// traffic is handled meanwhile.
    async fn pause_and_save(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        net: (Option<&Switch>, Option<&JobNet>),
        nodes: &BTreeSet<NodeId>,
        (id, last): (u64, bool),
        dir: PathBuf,
    ) -> Result<Vec<SavedVm>, NotTaken> {
        let mut paused: BTreeSet<u32> = BTreeSet::new();
        let mut heard = BTreeSet::new();
        let mut problems = Vec::new();
        let until = Instant::now() + PAUSE_WITHIN;
        while heard.len() < nodes.len() {
            match self.answer(plan, ranks, net, until).await? {
                Some((
                    from,
                    CheckpointMsg::Paused {
                        id: i,
                        ranks: r,
                        error,
                    },
                )) if i == id => {
                    heard.insert(from);
                    paused.extend(r);
                    problems.extend(error);
                }
                Some(_) => {}
                None => return Err(silent(nodes, &heard, "pause")),
            }
        }
        // A rank may have ended while the others paused; every other one must be paused.
        let missing: Vec<u32> = ranks
            .iter()
            .filter(|r| running(r) && !paused.contains(&r.rank))
            .map(|r| r.rank)
            .collect();
        if !problems.is_empty() || !missing.is_empty() {
            return Err(NotTaken::Failed(format!(
                "not every VM could be paused (ranks {missing:?} not paused){}",
                problems
                    .iter()
                    .map(|p| format!("; {p}"))
                    .collect::<String>()
            )));
        }
        for n in nodes {
            let dir = dir.clone();
            self.send(*n, Wire::Checkpoint(CheckpointMsg::Save { id, dir, last }));
        }
        let (mut saved, mut heard) = (Vec::new(), BTreeSet::new());
        let until = Instant::now() + SAVE_WITHIN;
        while heard.len() < nodes.len() {
            match self.answer(plan, ranks, net, until).await? {
                Some((from, CheckpointMsg::Saved { id: i, vms, error })) if i == id => {
                    heard.insert(from);
                    if let Some(e) = error {
                        problems.push(format!("{from}: {e}"));
                    }
                    saved.extend(vms.into_iter().filter(|v| paused.contains(&v.rank)));
                }
                Some(_) => {}
                None => return Err(silent(nodes, &heard, "save")),
            }
        }
        match problems.is_empty() {
            true => Ok(saved),
            false => Err(NotTaken::Failed(format!("saving: {}", problems.join("; ")))),
        }
    }

    /// The next checkpoint message before `until` (`None`: none came); every other message
    /// goes where it goes while the ranks run.
    async fn answer(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        (switch, net): (Option<&Switch>, Option<&JobNet>),
        until: Instant,
    ) -> Result<Option<(NodeId, CheckpointMsg)>, Ended> {
        loop {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return Ok(None);
            };
            match self.next(Some(left)).await? {
                Some(Event::Message {
                    from,
                    msg: Wire::Checkpoint(m),
                }) => return Ok(Some((from, m))),
                Some(Event::Message { from, msg }) => {
                    self.on_message(plan, ranks, switch, net, from, msg);
                }
                Some(_) => {}
                None => return Ok(None),
            }
        }
    }
}

/// A rank whose command still runs (no status, no error yet).
pub(super) fn running(r: &RankResult) -> bool {
    r.status.is_none() && r.error.is_none()
}

fn silent(nodes: &BTreeSet<NodeId>, heard: &BTreeSet<NodeId>, what: &str) -> NotTaken {
    let quiet: Vec<String> = nodes.difference(heard).map(|n| n.to_string()).collect();
    NotTaken::Failed(format!("no answer to {what} from {}", quiet.join(", ")))
}

/// The barrier notice of checkpoint `id`.
pub(super) fn notice(id: u64) -> i64 {
    NOTICE_BASE + id as i64
}

/// Each rank's record: saved (with its ranks' barrier connections), or ended with its status.
fn records(
    ranks: &[RankResult],
    saved: Vec<SavedVm>,
    hub: Option<&BarrierHub>,
) -> Result<Vec<RankRecord>, String> {
    let mut by_rank: BTreeMap<u32, SavedVm> = (saved.into_iter())
        .map(|mut s| {
            s.barrier = hub.map(|h| h.conns(&s.vm)).unwrap_or_default();
            (s.rank, s)
        })
        .collect();
    ranks
        .iter()
        .map(|r| {
            let saved = by_rank.remove(&r.rank);
            if saved.is_none() && running(r) {
                return Err(format!("rank {} was not saved", r.rank));
            }
            if r.error.is_some() {
                return Err(format!("rank {} failed: its VM cannot be restored", r.rank));
            }
            Ok(RankRecord {
                rank: r.rank,
                vm: r.vm.clone(),
                node: r.node.0,
                vcpus: r.cpus.len() as u32,
                status: if saved.is_some() { None } else { r.status },
                saved,
            })
        })
        .collect()
}

/// A manifest with what every checkpoint of this job repeats (ranks and times are each
/// checkpoint's own).
pub(super) fn base_manifest(
    job: &str,
    digest: &str,
    req: &super::LaunchRequest,
    plan: &JobPlan,
) -> Manifest {
    Manifest {
        format: manifest::FORMAT,
        seq: 0,
        job: job.to_string(),
        reason: Reason::Requested,
        taken_ms: 0,
        duration_ms: 0,
        image_digest: digest.to_string(),
        argv: req.argv.clone(),
        mpi: req.mpi,
        memory_mib: req.memory_mib,
        hostnames: plan.hostnames.clone(),
        network: req.network,
        shares: req.shares.clone(),
        cwd: req.cwd.clone(),
        cut: Cut::Pause,
        ranks: Vec::new(),
    }
}
