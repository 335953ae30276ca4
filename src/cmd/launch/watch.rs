//! The node agent's sampler (root role, issue 7): every period it samples the node (its
//! `/proc`, or its memory cgroup in the simulation mode) and each of its VMs — host view from
//! the hypervisor process, guest view through the VM's guest agent link — and sends the round
//! up the authenticated overlay to the front-end's controller.

use agents::{
    agent::{Control, JobHandle},
    proto::NodeId,
};
use launcher::wire::{MonitorMsg, Wire};
use monitor::{
    GuestProc, GuestSource, JobId, MonitorError, NodeCgroup, NodeName, Sampler, SamplerConfig,
    VmId, VmProcess,
};
use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};
use vse_guest_agent::GuestLink;

/// A VM the sampler watches: its hypervisor process and its guest agent link.
pub struct Watched {
    pub pid: u32,
    pub link: Arc<GuestLink>,
}

pub type Registry = Arc<Mutex<HashMap<VmId, Watched>>>;

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
        registry: Registry,
        h: JobHandle<Wire>,
    ) -> Result<Self, String> {
        let job = JobId::new(job).map_err(|e| e.to_string())?;
        let node = NodeName::new(node).map_err(|e| e.to_string())?;
        let cgroup = match node_memory_mib {
            Some(mib) => Some(
                NodeCgroup::create(&format!("vse-{job}-{node}"), mib)
                    .map_err(|e| format!("node memory cgroup: {e}"))?,
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
            .spawn(move || run(Sampler::new(cfg), registry, h, stopped))
            .map_err(|e| format!("starting the sampler: {e}"))?;
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

fn run(mut s: Sampler, registry: Registry, h: JobHandle<Wire>, stopped: mpsc::Receiver<()>) {
    let period = s.config().period;
    let mut reported = false;
    loop {
        let (vms, links): (Vec<VmProcess>, HashMap<VmId, Arc<GuestLink>>) = {
            let reg = crate::sync::lock(&registry);
            (
                reg.iter()
                    .map(|(vm, w)| VmProcess {
                        vm: vm.clone(),
                        pid: w.pid,
                    })
                    .collect(),
                reg.iter()
                    .map(|(vm, w)| (vm.clone(), w.link.clone()))
                    .collect(),
            )
        };
        match s.sample_all(&vms, &mut Links(links)) {
            Ok(samples) => send(&h, Wire::Monitor(MonitorMsg::Samples { samples })),
            // Said once: the controller keeps the first error, the agent's log would repeat it.
            Err(e) if !reported => {
                reported = true;
                send(
                    &h,
                    Wire::Monitor(MonitorMsg::Failed {
                        reason: e.to_string(),
                    }),
                );
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
