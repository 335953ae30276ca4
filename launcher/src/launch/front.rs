//! The front-end of `vse launch`: bootstrap the agents, stage the image to every node, order
//! each node's VMs, relay rank output and statuses, and tear the job down whatever happens.

use super::{LaunchError, NodeCpus, exit_code, job_status, plan_ranks};
use crate::{
    agent::{AgentConfig, Control, Event, Failure, Job},
    net::{JobNet, Switch, SwitchStats},
    proto::{Msg, NodeId, Stream},
    stage::{StageOptions, StageSummary, stage_image},
};
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub image: PathBuf,
    pub argv: Vec<String>,
    pub vms_per_node: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub vms_per_core: u32,
    /// auto, qemu, libvirt...: passed to V2M on the nodes.
    pub hypervisor: String,
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

#[derive(Debug, Clone, serde::Serialize)]
pub struct RankResult {
    pub rank: u32,
    pub node: NodeId,
    pub host: String,
    pub vm: String,
    pub cpus: Vec<usize>,
    pub status: Option<i32>,
    pub error: Option<String>,
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
}

/// Runs the whole job on a runtime of its own.
pub fn launch_blocking(
    cfg: AgentConfig,
    req: LaunchRequest,
    on: impl FnMut(LaunchEvent) + Send,
) -> Result<LaunchReport, LaunchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LaunchError::Runtime(e.to_string()))?;
    rt.block_on(launch(cfg, req, on))
}

struct Front<F> {
    job: Job,
    on: F,
    failures: Vec<Failure>,
}

impl<F: FnMut(LaunchEvent)> Front<F> {
    /// Next event that matters, or Err(reason) once an agent failed or the front-end ended.
    async fn next(&mut self, within: Option<Duration>) -> Result<Option<Event>, String> {
        let e = match within {
            Some(d) => match tokio::time::timeout(d, self.job.next_event()).await {
                Ok(e) => e,
                Err(_) => return Ok(None),
            },
            None => self.job.next_event().await,
        };
        match e {
            Some(Event::NodeFailed { node, by, reason }) => {
                let msg = format!("{node} failed ({reason}, seen by {by})");
                self.failures.push(Failure { node, by, reason });
                Err(msg)
            }
            Some(Event::ShuttingDown { reason }) => Err(reason),
            Some(e) => Ok(Some(e)),
            None => Err("the front-end agent ended".into()),
        }
    }

    async fn finish(mut self, mut report: LaunchReport) -> LaunchReport {
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
        report
    }
}

fn report(code: u8, reason: String) -> LaunchReport {
    LaunchReport {
        exit_code: code,
        reason,
        ranks: Vec::new(),
        staging: None,
        failures: Vec::new(),
        network: None,
    }
}

async fn launch(
    cfg: AgentConfig,
    req: LaunchRequest,
    on: impl FnMut(LaunchEvent),
) -> Result<LaunchReport, LaunchError> {
    let n = cfg.hosts.len() as u32;
    let hosts = cfg.hosts.clone();
    let front_ip = cfg.bind;
    let (secret, k) = (cfg.secret.clone(), cfg.tree.k());
    let per_agent = req.vms_per_node * req.vcpus;
    let nodes: Vec<NodeCpus> = (1..=n)
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
    // Refuse an impossible placement before starting anything.
    let slots = plan_ranks(&nodes, req.vms_per_node, req.vcpus, req.vms_per_core)?;
    let mut f = Front {
        job: Job::start(cfg),
        on,
        failures: Vec::new(),
    };
    (f.on)(LaunchEvent::Phase(format!("starting {n} agent(s)")));
    loop {
        match f.next(None).await {
            Ok(Some(Event::Ready { .. })) => break,
            Ok(_) => {}
            Err(r) => return Ok(f.finish(report(exit_code::AGENT_FAILURE, r)).await),
        }
    }

    (f.on)(LaunchEvent::Phase("staging the image".into()));
    for i in 1..=n {
        f.job.control(Control::Send {
            dst: NodeId(i),
            msg: Msg::LaunchStage,
        });
    }
    let mut listeners: HashMap<NodeId, SocketAddr> = HashMap::new();
    while listeners.len() < n as usize {
        match f.next(Some(Duration::from_secs(60))).await {
            Ok(Some(Event::Message {
                from,
                msg: Msg::StageListening { addr },
            })) => {
                listeners.insert(from, addr);
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
                return Ok(f.finish(report(exit_code::STAGING_FAILURE, r)).await);
            }
            Err(r) => return Ok(f.finish(report(exit_code::AGENT_FAILURE, r)).await),
        }
    }
    let mut plan: Vec<(NodeId, SocketAddr)> = listeners.into_iter().collect();
    plan.sort();
    let summary = match stage_image(&req.image, &plan, k, &secret, req.stage).await {
        Ok(s) => s,
        Err(e) => {
            let r = format!("staging: {e}");
            return Ok(f.finish(report(exit_code::STAGING_FAILURE, r)).await);
        }
    };
    let failed = summary.failed();
    if !failed.is_empty() {
        let what: Vec<String> = failed.iter().map(|(n, r)| format!("{n}: {r}")).collect();
        let mut rep = report(
            exit_code::STAGING_FAILURE,
            format!("staging failed on {}", what.join("; ")),
        );
        rep.staging = Some(summary);
        return Ok(f.finish(rep).await);
    }

    let size = slots.len() as u32;
    let vm_names: Vec<String> = (0..size)
        .map(|r| super::vm_name(&req.job_name, r))
        .collect();
    (f.on)(LaunchEvent::Phase(format!(
        "booting {size} VM(s) on {n} node(s)"
    )));
    // The switch lives as long as this function: every VM is gone before it stops.
    let (switch, net) = match req.network {
        None => (None, None),
        Some((base, prefix)) => {
            let started = Switch::start(front_ip).and_then(|sw| {
                let net = JobNet::new(base, prefix, sw.addr(), size)?;
                Ok((sw, net))
            });
            match started {
                Ok((sw, net)) => (Some(sw), Some(net)),
                Err(e) => {
                    let mut rep = report(exit_code::VM_FAILURE, format!("job network: {e}"));
                    rep.staging = Some(summary);
                    return Ok(f.finish(rep).await);
                }
            }
        }
    };
    let mut per_node: BTreeMap<NodeId, Vec<_>> = BTreeMap::new();
    for s in &slots {
        per_node.entry(s.node).or_default().push(s.order.clone());
    }
    for (node, vms) in per_node {
        f.job.control(Control::Send {
            dst: node,
            msg: Msg::LaunchVms {
                digest: summary.digest.clone(),
                size,
                hosts: vm_names.clone(),
                argv: req.argv.clone(),
                vms,
                memory_mib: req.memory_mib,
                hypervisor: req.hypervisor.clone(),
                net: net.clone(),
                mpi: req.mpi,
            },
        });
    }
    let mut ranks: Vec<RankResult> = slots
        .iter()
        .map(|s| RankResult {
            rank: s.order.rank,
            node: s.node,
            host: hosts[s.node.0 as usize - 1].host.clone(),
            vm: vm_names[s.order.rank as usize].clone(),
            cpus: s.order.cpus.clone(),
            status: None,
            error: None,
        })
        .collect();
    let mut done = 0;
    let mut ended = None;
    // Under --mpi only rank 0 runs a command (mpirun); the others host its processes until
    // it ends. A VM that fails, though, ends the job either way.
    let finished = |done: usize, ranks: &[RankResult]| {
        if req.mpi {
            ranks[0].status.is_some() || ranks.iter().any(|r| r.error.is_some())
        } else {
            done == ranks.len()
        }
    };
    while !finished(done, &ranks) {
        match f.next(None).await {
            Ok(Some(Event::Message { from, msg })) => match msg {
                Msg::RankOutput { rank, stream, data } if owns(&ranks, from, rank) => {
                    (f.on)(LaunchEvent::Output {
                        rank,
                        stream,
                        text: data,
                    });
                }
                // Admitted only from the node that runs the rank, at that node's address.
                Msg::VmEndpoint { rank, addr } if owns(&ranks, from, rank) => {
                    let node_ip = hosts.get(from.0 as usize - 1).map(|h| h.addr);
                    if let (Some(sw), Some(net), true) = (&switch, &net, node_ip == Some(addr.ip()))
                    {
                        sw.register(addr, net.rank(rank).mac);
                    }
                }
                Msg::RankExited { rank, code, error } if owns(&ranks, from, rank) => {
                    let r = &mut ranks[rank as usize];
                    if r.status.is_none() && r.error.is_none() {
                        done += 1;
                    }
                    if error.is_some() {
                        r.error = error;
                    } else {
                        r.status = Some(code);
                    }
                }
                _ => {}
            },
            Ok(_) => {}
            Err(r) => {
                ended = Some(r);
                break;
            }
        }
    }
    let (code, reason) = match ended {
        Some(r) => (exit_code::AGENT_FAILURE, r),
        None if ranks.iter().any(|r| r.error.is_some()) => (
            exit_code::VM_FAILURE,
            "a VM could not run the command".to_string(),
        ),
        None => {
            let st: Vec<(u32, i32)> = ranks
                .iter()
                .take(if req.mpi { 1 } else { ranks.len() })
                .map(|r| (r.rank, r.status.unwrap_or(-1)))
                .collect();
            (job_status(&st), "completed".to_string())
        }
    };
    let mut rep = report(code, reason);
    rep.ranks = ranks;
    rep.staging = Some(summary);
    let mut rep = f.finish(rep).await;
    rep.network = switch.map(|s| s.stats());
    Ok(rep)
}

/// A node may only report the ranks it was given.
fn owns(ranks: &[RankResult], from: NodeId, rank: u32) -> bool {
    ranks.get(rank as usize).is_some_and(|r| r.node == from)
}
