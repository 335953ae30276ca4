//! The node agent's sampler: every period it samples the node (its `/proc`, or its memory
//! cgroup in the simulation mode) and each VM running a rank — host view from the hypervisor
//! process, guest view through the VM's guest agent link — and sends the round up the
//! authenticated overlay to the front-end's controller.

use super::NodeState;
use crate::wire::{MonitorMsg, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use monitor::{
    GuestProc, GuestSource, IdError, JobId, MonitorError, NodeCgroup, NodeName, Sampler,
    SamplerConfig, VmId, VmProcess,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::Duration;
use vse_guest_agent::GuestLink;

/// Why a node cannot monitor itself as the front-end asked.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Id(#[from] IdError),
    #[error("node memory cgroup: {0}")]
    Cgroup(#[source] MonitorError),
    #[error("starting the sampler: {0}")]
    Thread(#[source] std::io::Error),
}

/// A host that cannot give a node its memory cgroup lacks a component; the rest are bugs.
impl vse_exit::Classify for WatchError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            WatchError::Cgroup(_) => vse_exit::ErrorKind::MissingComponent,
            _ => vse_exit::ErrorKind::Internal,
        }
    }
}

struct Links(HashMap<VmId, Arc<GuestLink>>);

impl GuestSource for Links {
    fn guest_proc(&mut self, vm: &VmId) -> Result<Option<GuestProc>, MonitorError> {
        let Some(link) = self.0.get(vm) else {
            return Ok(None);
        };
        // Under emulation a busy guest answers slowly; a late answer is a gap, not an error
        // of the job.
        let (meminfo, stat) =
            link.sample(Duration::from_secs(3))
                .map_err(|e| MonitorError::Guest {
                    vm: vm.to_string(),
                    reason: e.to_string(),
                })?;
        Ok(Some(GuestProc { meminfo, stat }))
    }
}

/// The running sampler; stops (and removes the node's cgroup) when dropped.
pub struct NodeMonitor {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    cgroup: Option<NodeCgroup>,
}

fn send(h: &JobHandle<Wire>, msg: Wire) {
    h.control(Control::Send {
        dst: NodeId(0),
        msg,
    });
}

impl NodeMonitor {
    pub fn start(
        job: &str,
        node: &str,
        period: Duration,
        node_memory_mib: Option<u64>,
        state: Arc<NodeState>,
        h: JobHandle<Wire>,
    ) -> Result<Self, WatchError> {
        let job = JobId::new(job)?;
        let node = NodeName::new(node)?;
        let cgroup = match node_memory_mib {
            Some(mib) => Some(
                NodeCgroup::create(&format!("vse-{job}-{node}"), mib)
                    .map_err(WatchError::Cgroup)?,
            ),
            None => None,
        };
        let mut cfg = SamplerConfig::new(node);
        cfg.job = Some(job);
        cfg.period = period;
        cfg.mem_cgroup = cgroup.as_ref().map(|c| c.path().to_path_buf());
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vse-sampler".into())
            .spawn(move || run(Sampler::new(cfg), &state, &h, &stopped))
            .map_err(WatchError::Thread)?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
            cgroup,
        })
    }

    /// The node's memory cgroup (simulation mode): its VMs' hypervisors go there.
    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_ref().map(NodeCgroup::path)
    }
}

fn run(mut s: Sampler, state: &NodeState, h: &JobHandle<Wire>, stopped: &mpsc::Receiver<()>) {
    let period = s.config().period;
    let mut reported = false;
    loop {
        let watched = state.watched();
        let vms: Vec<VmProcess> = (watched.iter())
            .map(|(vm, pid, _)| VmProcess {
                vm: vm.clone(),
                pid: *pid,
            })
            .collect();
        let links = watched.into_iter().map(|(vm, _, link)| (vm, link));
        match s.sample_all(&vms, &mut Links(links.collect())) {
            Ok(samples) => send(h, Wire::Monitor(MonitorMsg::Samples { samples })),
            // Said once: the controller keeps the first error, the agent's log would repeat it.
            Err(e) if !reported => {
                reported = true;
                let reason = e.to_string();
                send(h, Wire::Monitor(MonitorMsg::Failed { reason }));
            }
            Err(_) => {}
        }
        match stopped.recv_timeout(period) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

impl Drop for NodeMonitor {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
