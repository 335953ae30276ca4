//! The phases of a launch after the agents start: wait for the overlay, stage the image, start
//! monitoring, order each node's VMs, then collect rank output and statuses (following VMs that
//! migrate) until the job is finished. Each phase that fails hands back the report to end with.

use super::checkpoint::{Checkpointing, NotTaken, Taken, running};
use super::front::{Ended, Front, LaunchEvent, LaunchReport, LaunchRequest, RankResult, report};
use super::relay::Owners;
use super::wake::{REQUEST_POLL, Requests, Step, recv, sleep_until, terminate_signal};
use super::{LaunchError, NodeCpus, plan_ranks};
use crate::ckpt::Reason;
use crate::sync::lock;
use crate::{
    net::{JobNet, Switch},
    stage::{StageOptions, StageSummary, stage_image},
    wire::{LaunchMsg, MigrateMsg, MonitorMsg, VmOrder, Wire},
};
use agents::{
    agent::{AgentConfig, Control, HostEntry},
    proto::NodeId,
    secret::JobSecret,
};
use monitor::{JobId, NodeName, VmId};
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::Path,
    sync::Arc,
    time::Duration,
};
use vse_exit::Exit;

type Event = agents::agent::Event<Wire>;

/// Where every rank goes, decided before anything starts.
pub(super) struct JobPlan {
    /// Node agents (agent i+1 runs on `hosts[i]`).
    pub agents: u32,
    pub hosts: Arc<Vec<HostEntry>>,
    pub slots: Vec<super::plan::VmSlot>,
    pub vm_names: Vec<String>,
    /// The guests' hostnames, by rank (the VM names unless a policy names them).
    pub hostnames: Vec<String>,
    /// The controller's name of each node, in agent order.
    pub names: Vec<NodeName>,
    pub layout: Option<super::JobLayout>,
    /// The job's status is rank 0's (mpirun's); the other VMs host its processes.
    pub mpi: bool,
}

impl JobPlan {
    pub fn new(cfg: &AgentConfig, req: &LaunchRequest) -> Result<JobPlan, LaunchError> {
        let n = cfg.hosts.len() as u32;
        let hosts = cfg.hosts.clone();
        if req.spare_nodes >= n {
            return Err(LaunchError::NoNodeLeft {
                nodes: n,
                spare: req.spare_nodes,
            });
        }
        let per_agent = req.vms_per_node * req.vcpus;
        let nodes: Vec<NodeCpus> = (1..=n - req.spare_nodes)
            .map(|i| {
                let before = if req.shared_machine {
                    (i - 1) * per_agent
                } else {
                    0
                };
                NodeCpus {
                    node: NodeId(i),
                    host: hosts[i as usize - 1].host.clone(),
                    cpus: req.cpus.get(i as usize - 1).copied().unwrap_or(1),
                    first_core: before,
                    shared_load: before,
                }
            })
            .collect();
        let slots = plan_ranks(&nodes, req.vms_per_node, req.vcpus, req.vms_per_core)?;
        let vm_names: Vec<String> = (0..slots.len() as u32)
            .map(|r| super::vm_name(&req.job_name, r))
            .collect();
        let hostnames = match &req.hostnames {
            Some(h) => (slots.iter().enumerate())
                .map(|(r, s)| {
                    let host = &hosts[s.node.0 as usize - 1].host;
                    h.pattern.render(&h.job, r as u32, host)
                })
                .collect(),
            None => vm_names.clone(),
        };
        let names =
            super::front::node_names(&hosts.iter().map(|h| h.host.clone()).collect::<Vec<_>>())?;
        let mut plan = JobPlan {
            agents: n,
            hosts,
            slots,
            vm_names,
            hostnames,
            names,
            layout: None,
            mpi: req.mpi,
        };
        if req.monitor.is_some() {
            plan.layout = Some(plan.layout(&req.job_name, req.memory_mib)?);
        }
        Ok(plan)
    }

    pub fn size(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Whether VMs are pinned to their planned cores: always on real nodes; on nodes that
    /// share one machine only while every vCPU of the job has a core of its own. Past that
    /// the plan stacks VMs of different nodes on one core while others idle, and two
    /// emulated (TCG) VMs spinning on one core slow each other down tenfold; unpinned, the
    /// kernel spreads them.
    pub fn pin(&self, req: &LaunchRequest) -> bool {
        let vcpus: usize = self.slots.iter().map(|s| s.order.cpus.len()).sum();
        let machine = req.cpus.first().copied().unwrap_or(1) as usize;
        !req.shared_machine || vcpus <= machine
    }

    /// What the controller records: the job, its nodes, and each VM where it starts.
    fn layout(&self, job: &str, memory_mib: u64) -> Result<super::JobLayout, LaunchError> {
        let bad = |e: String| LaunchError::Monitor(e);
        let job = JobId::new(job.to_string()).map_err(|e| bad(e.to_string()))?;
        let vms = self
            .slots
            .iter()
            .map(|s| {
                let vm = VmId::new(self.vm_names[s.order.rank as usize].clone())
                    .map_err(|e| bad(e.to_string()))?;
                let node = self.names[s.node.0 as usize - 1].clone();
                Ok((vm, node, memory_mib * 1024))
            })
            .collect::<Result<Vec<_>, LaunchError>>()?;
        Ok(super::JobLayout {
            job,
            nodes: self.names.clone(),
            vms,
        })
    }

    /// Which node runs each VM (updated as VMs migrate).
    pub fn owners(&self) -> Owners {
        Arc::new(std::sync::Mutex::new(
            self.slots
                .iter()
                .map(|s| (self.vm_names[s.order.rank as usize].clone(), s.node))
                .collect(),
        ))
    }

    /// Every rank, not yet started.
    pub fn ranks(&self) -> Vec<RankResult> {
        self.slots
            .iter()
            .map(|s| RankResult {
                rank: s.order.rank,
                node: s.node,
                host: self.host(s.node),
                vm: self.vm_names[s.order.rank as usize].clone(),
                cpus: s.order.cpus.clone(),
                status: None,
                error: None,
                times: None,
            })
            .collect()
    }

    fn host(&self, node: NodeId) -> String {
        self.hosts[node.0 as usize - 1].host.clone()
    }
}

impl<F: FnMut(LaunchEvent)> Front<F> {
    /// Waits until every agent is up and linked into the overlay; where they listen.
    pub(super) async fn ready(&mut self) -> Result<Vec<(NodeId, SocketAddr)>, Ended> {
        loop {
            if let Some(Event::Ready { directory, .. }) = self.next(None).await? {
                return Ok(directory);
            }
        }
    }

    /// Stages the image to every node, or the report that ends the job.
    pub(super) async fn stage(
        &mut self,
        image: &Path,
        n: u32,
        k: u32,
        secret: &JobSecret,
        opts: StageOptions,
    ) -> Result<StageSummary, Box<LaunchReport>> {
        for i in 1..=n {
            self.send(NodeId(i), Wire::Launch(LaunchMsg::Stage));
        }
        let mut listeners: HashMap<NodeId, SocketAddr> = HashMap::new();
        while listeners.len() < n as usize {
            match self.next(Some(Duration::from_secs(60))).await {
                Ok(Some(Event::Message {
                    from,
                    msg: Wire::Launch(LaunchMsg::StageListening { addr }),
                })) => {
                    listeners.insert(from, addr);
                }
                Ok(Some(Event::Message {
                    from,
                    msg: Wire::Launch(LaunchMsg::StageRefused { reason }),
                })) => {
                    let r = format!("staging refused by {from}: {reason}");
                    return Err(Box::new(report(Exit::StagingFailed.code(), r)));
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    let missing: Vec<String> = (1..=n)
                        .map(NodeId)
                        .filter(|i| !listeners.contains_key(i))
                        .map(|i| i.to_string())
                        .collect();
                    let r = format!(
                        "no staging listener from {} (see their agent logs)",
                        missing.join(", ")
                    );
                    return Err(Box::new(report(Exit::StagingFailed.code(), r)));
                }
                Err(r) => return Err(Box::new(report(Exit::NodeFailed.code(), r.to_string()))),
            }
        }
        let mut plan: Vec<(NodeId, SocketAddr)> = listeners.into_iter().collect();
        plan.sort();
        let summary = stage_image(image, &plan, k, secret, opts)
            .await
            .map_err(|e| Box::new(report(Exit::StagingFailed.code(), format!("staging: {e}"))))?;
        let failed = summary.failed();
        if !failed.is_empty() {
            let what: Vec<String> = failed.iter().map(|(n, r)| format!("{n}: {r}")).collect();
            let mut rep = report(
                Exit::StagingFailed.code(),
                format!("staging failed on {}", what.join("; ")),
            );
            rep.staging = Some(summary);
            return Err(Box::new(rep));
        }
        Ok(summary)
    }

    /// Every node agent starts sampling itself and its VMs.
    pub(super) fn start_monitoring(&mut self, m: &super::MonitorRequest, job: &str, n: u32) {
        for i in 1..=n {
            let msg = Wire::Monitor(MonitorMsg::Start {
                job: job.to_string(),
                node: self.names[i as usize - 1].to_string(),
                period_ms: m.period.as_millis().max(1) as u64,
                node_memory_mib: m.node_memory_mib,
            });
            self.send(NodeId(i), msg);
        }
    }

    /// Each node gets the order for its VMs.
    pub(super) fn order_vms(
        &mut self,
        req: &LaunchRequest,
        plan: &JobPlan,
        digest: &str,
        net: Option<JobNet>,
    ) {
        let forward_stdin = req.stdin && req.restore.is_none();
        let mut per_node: BTreeMap<NodeId, Vec<VmOrder>> = BTreeMap::new();
        for s in &plan.slots {
            let order = match &req.restore {
                Some(ck) => super::restore::order(ck, s.order.clone()),
                None => Some(s.order.clone()),
            };
            if let Some(o) = order {
                per_node.entry(s.node).or_default().push(o);
            }
        }
        for (node, vms) in per_node {
            let msg = Wire::Launch(LaunchMsg::Vms {
                digest: digest.to_string(),
                size: plan.size(),
                hosts: plan.vm_names.clone(),
                hostnames: plan.hostnames.clone(),
                argv: req.argv.clone(),
                vms,
                memory_mib: req.memory_mib,
                hypervisor: req.hypervisor,
                net: net.clone(),
                mpi: req.mpi,
                pin: plan.pin(req),
                boot_templates: req.boot_templates,
                guest_root: req.guest_root,
                stdin: forward_stdin,
                shares: req.shares.clone(),
                cwd: req.cwd.clone(),
                cache: req.cache,
            });
            self.send(node, msg);
        }
        if let Some(vm) = plan.vm_names.first() {
            // A restored rank 0 may have been reading its input when it was saved: it gets
            // its end (an empty last chunk closes an input wherever it is).
            let input: Box<dyn std::io::Read + Send> = match (forward_stdin, &req.restore) {
                (true, _) => Box::new(std::io::stdin()),
                (false, Some(_)) => Box::new(std::io::empty()),
                (false, None) => return,
            };
            let h = self.job.handle();
            let taken = super::input::forward(input, vm.clone(), self.owners.clone(), h);
            self.stdin_taken = Some(taken);
        }
    }

    /// Rank output and statuses until the job is finished (under `--mpi`, when rank 0's
    /// mpirun ends: the other VMs only host its processes), or why it ended early; with
    /// checkpointing, the checkpoints due meanwhile (into `taken`).
    pub(super) async fn collect(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        net: (Option<&Switch>, Option<&JobNet>),
        mut ck: Option<&mut Checkpointing>,
        taken: &mut Vec<Taken>,
        mut asked: Option<&mut Requests>,
    ) -> Option<Ended> {
        let mpi = plan.mpi;
        let finished = |ranks: &[RankResult]| {
            // A VM that fails ends the job either way.
            if mpi {
                ranks[0].status.is_some() || ranks.iter().any(|r| r.error.is_some())
            } else {
                ranks.iter().all(|r| !running(r))
            }
        };
        let mut term = match ck.as_ref().filter(|c| c.on_term) {
            Some(_) => terminate_signal(),
            None => None,
        };
        let mut poll = tokio::time::interval(REQUEST_POLL);
        while !finished(ranks) {
            let due = ck.as_ref().and_then(|c| c.schedule.next());
            let step = tokio::select! {
                e = self.next(None) => Step::Event(e),
                _ = poll.tick(), if asked.is_some() => {
                    match asked.as_deref_mut().and_then(Requests::next) {
                        Some(id) => Step::Asked(id),
                        None => continue,
                    }
                }
                _ = sleep_until(due.map(|d| d.0)), if due.is_some() => {
                    Step::Due(due.map_or(Reason::Periodic, |d| d.1))
                }
                _ = recv(&mut term), if term.is_some() => Step::Due(Reason::Preempted),
            };
            let reason = match step {
                Step::Event(Ok(Some(Event::Message { from, msg }))) => {
                    self.on_message(plan, ranks, net.0, net.1, from, msg);
                    continue;
                }
                Step::Event(Ok(_)) => continue,
                Step::Event(Err(r)) => return Some(r),
                Step::Due(reason) => reason,
                Step::Asked(id) => {
                    let Some(c) = ck.as_deref_mut() else {
                        if let Some(a) = asked.as_deref_mut() {
                            a.failed(id, "the job was launched without --checkpoint-dir");
                        }
                        continue;
                    };
                    let r = self
                        .checkpoint(plan, ranks, net, c, Reason::Requested)
                        .await;
                    if let Some(a) = asked.as_deref_mut() {
                        a.answer(id, &r);
                    }
                    match r {
                        Ok(t) => taken.push(t),
                        Err(NotTaken::Ended(r)) => return Some(r),
                        Err(NotTaken::Failed(_)) => {}
                    }
                    continue;
                }
            };
            let Some(c) = ck.as_deref_mut() else { continue };
            match self.checkpoint(plan, ranks, net, c, reason).await {
                Ok(t) if reason.stops() => return Some(Ended::Checkpointed(t)),
                Ok(t) => taken.push(t),
                Err(NotTaken::Ended(r)) => return Some(r),
                Err(NotTaken::Failed(e)) if reason == Reason::Preempted => {
                    return Some(Ended::Terminated(format!("; no checkpoint: {e}")));
                }
                Err(NotTaken::Failed(e)) => {
                    (self.on)(LaunchEvent::Phase(format!("checkpoint failed: {e}")));
                    eprintln!(
                        "vse launch: {} checkpoint failed, the job runs on: {e}",
                        reason.as_str()
                    );
                    c.schedule.failed(reason, std::time::Instant::now());
                }
            }
        }
        None
    }

    /// One message while the ranks run; returns how many ranks it finished (0 or 1).
    pub(super) fn on_message(
        &mut self,
        plan: &JobPlan,
        ranks: &mut [RankResult],
        switch: Option<&Switch>,
        net: Option<&JobNet>,
        from: NodeId,
        msg: Wire,
    ) -> usize {
        if self.monitoring(from, &msg) {
            return 0;
        }
        match msg {
            Wire::Migrate(MigrateMsg::Done {
                vm,
                rank,
                error,
                transfer,
            }) => {
                // The destination runs the VM now: its rank's output and status come from it.
                if error.is_none()
                    && let Some(r) = ranks.get_mut(rank as usize).filter(|r| r.vm == vm)
                {
                    r.node = from;
                    r.host = plan.host(from);
                    lock(&self.owners).insert(vm.clone(), from);
                    let moved = r.clone();
                    if let Some(rec) = self.record.as_mut() {
                        rec.update(|a| a.ranks[rank as usize] = moved);
                    }
                }
                if let Some(tx) = &self.reports {
                    let _ = tx.send((vm, error, transfer));
                }
            }
            Wire::Launch(LaunchMsg::RankOutput { rank, stream, data })
                if owns(ranks, from, rank) =>
            {
                self.mark("first output");
                (self.on)(LaunchEvent::Output {
                    rank,
                    stream,
                    text: data,
                });
            }
            Wire::Launch(LaunchMsg::StdinTaken { rank: 0, upto }) if owns(ranks, from, 0) => {
                if let Some(tx) = &self.stdin_taken {
                    let _ = tx.send(upto);
                }
            }
            // Admitted only from the node that runs the rank, at that node's address.
            Wire::Launch(LaunchMsg::VmEndpoint {
                rank,
                addr,
                session,
            }) if owns(ranks, from, rank) => {
                let node_ip = plan.hosts.get(from.0 as usize - 1).map(|h| h.addr);
                if let (Some(sw), Some(net), true) = (switch, net, node_ip == Some(addr.ip())) {
                    sw.register(addr, rank, session, net.rank(rank).mac);
                }
            }
            Wire::Launch(LaunchMsg::RankExited {
                rank,
                code,
                error,
                times,
            }) if owns(ranks, from, rank) => {
                let r = &mut ranks[rank as usize];
                r.times = times;
                let first = r.status.is_none() && r.error.is_none();
                if error.is_some() {
                    r.error = error;
                } else {
                    r.status = Some(code);
                }
                let ended = r.clone();
                if let Some(rec) = self.record.as_mut() {
                    rec.update(|a| a.ranks[rank as usize] = ended);
                }
                return usize::from(first);
            }
            _ => {}
        }
        0
    }

    pub(super) fn send(&self, dst: NodeId, msg: Wire) {
        self.job.control(Control::Send { dst, msg });
    }
}

/// A node may only report the ranks it was given.
fn owns(ranks: &[RankResult], from: NodeId, rank: u32) -> bool {
    ranks.get(rank as usize).is_some_and(|r| r.node == from)
}
