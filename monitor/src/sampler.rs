//! The per-node sampler. It keeps the previous cumulative counters so utilisation is a delta
//! over the sampling period, as LDMS samplers do, instead of a since-boot average.

use super::procfs::{self, CpuTimes};
use super::{
    GuestView, HostView, JobId, MonitorError, NodeName, NodeSample, Sample, VmId, VmSample,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    pub node: NodeName,
    pub job: Option<JobId>,
    /// Usually `/proc`; tests point it elsewhere.
    pub proc_root: PathBuf,
    pub period: Duration,
    /// Node memory from this memory cgroup instead of `/proc/meminfo` (several nodes sharing
    /// one machine, or a node whose share is a cgroup); see [`super::cgroup_meminfo`].
    pub mem_cgroup: Option<PathBuf>,
}

impl SamplerConfig {
    pub fn new(node: NodeName) -> Self {
        Self {
            node,
            job: None,
            proc_root: PathBuf::from("/proc"),
            period: Duration::from_secs(1),
            mem_cgroup: None,
        }
    }
}

/// A VM on this node: its id and the PID of its hypervisor process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmProcess {
    pub vm: VmId,
    pub pid: u32,
}

/// Raw guest `/proc/meminfo` and `/proc/stat` text as shipped by the guest agent.
#[derive(Debug, Clone)]
pub struct GuestProc {
    pub meminfo: String,
    pub stat: String,
}

/// Supplies the guest view. The guest agent implements this over its channel; a node whose
/// VMs have no agent (or a test) uses [`NoGuest`].
pub trait GuestSource {
    fn guest_proc(&mut self, vm: &VmId) -> Result<Option<GuestProc>, MonitorError>;
}

/// No guest view available.
pub struct NoGuest;

impl GuestSource for NoGuest {
    fn guest_proc(&mut self, _vm: &VmId) -> Result<Option<GuestProc>, MonitorError> {
        Ok(None)
    }
}

#[derive(Default)]
struct VmPrev {
    host: Option<(u64, std::time::Instant)>,
    guest: Option<CpuTimes>,
}

pub struct Sampler {
    cfg: SamplerConfig,
    clk_tck: f64,
    prev_cpu: Option<CpuTimes>,
    prev_vm: HashMap<VmId, VmPrev>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        // SAFETY: sysconf has no preconditions; it only reads a constant.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self {
            cfg,
            clk_tck: if tck > 0 { tck as f64 } else { 100.0 },
            prev_cpu: None,
            prev_vm: HashMap::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    fn read(&self, name: &str) -> Result<(String, String), MonitorError> {
        let path = self.cfg.proc_root.join(name);
        let text = std::fs::read_to_string(&path).map_err(|source| MonitorError::Read {
            path: path.clone(),
            source,
        })?;
        Ok((text, path.display().to_string()))
    }

    /// Samples the node itself.
    pub fn sample_node(&mut self) -> Result<NodeSample, MonitorError> {
        let mem = match &self.cfg.mem_cgroup {
            Some(dir) => super::cgroup::cgroup_meminfo(dir)?,
            None => {
                let (mem_text, mem_origin) = self.read("meminfo")?;
                procfs::parse_meminfo(&mem_text, &mem_origin)?
            }
        };
        let (stat_text, stat_origin) = self.read("stat")?;
        let times = procfs::parse_cpu_times(&stat_text, &stat_origin)?;
        let cpu = self
            .prev_cpu
            .as_ref()
            .map(|p| times.utilisation_since(p))
            .unwrap_or_default();
        self.prev_cpu = Some(times);
        Ok(NodeSample {
            ts_ms: now_ms(),
            job: self.cfg.job.clone(),
            node: self.cfg.node.clone(),
            mem,
            cpu,
        })
    }

    /// Samples one VM: host view from its hypervisor process, guest view from `guest`.
    /// Failures of one view are recorded in the sample, not raised, so one dead agent does
    /// not blind the controller to the rest of the node.
    pub fn sample_vm(&mut self, vm: &VmProcess, guest: &mut dyn GuestSource) -> VmSample {
        let mut errors = Vec::new();
        let prev = self.prev_vm.entry(vm.vm.clone()).or_default();
        let host = match procfs::read_process(&self.cfg.proc_root, vm.pid) {
            Ok(p) => {
                let now = std::time::Instant::now();
                let cpu_cores = prev.host.map(|(ticks, at)| {
                    let dt = now.duration_since(at).as_secs_f64();
                    if dt <= 0.0 {
                        0.0
                    } else {
                        p.cpu_ticks.saturating_sub(ticks) as f64 / self.clk_tck / dt
                    }
                });
                prev.host = Some((p.cpu_ticks, now));
                Some(HostView {
                    pid: vm.pid,
                    rss_kib: p.rss_kib,
                    cpu_seconds: p.cpu_ticks as f64 / self.clk_tck,
                    cpu_cores,
                })
            }
            Err(e) => {
                prev.host = None;
                errors.push(format!("host view: {e}"));
                None
            }
        };
        let guest = match guest.guest_proc(&vm.vm) {
            Ok(Some(g)) => {
                let origin = format!("guest {}", vm.vm);
                match procfs::parse_meminfo(&g.meminfo, &format!("{origin} /proc/meminfo"))
                    .and_then(|m| {
                        procfs::parse_cpu_times(&g.stat, &format!("{origin} /proc/stat"))
                            .map(|t| (m, t))
                    }) {
                    Ok((mem, times)) => {
                        let cpu = prev
                            .guest
                            .as_ref()
                            .map(|p| times.utilisation_since(p))
                            .unwrap_or_default();
                        prev.guest = Some(times);
                        Some(GuestView { mem, cpu })
                    }
                    Err(e) => {
                        errors.push(format!("guest view: {e}"));
                        None
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                errors.push(format!("guest view: {e}"));
                None
            }
        };
        VmSample {
            ts_ms: now_ms(),
            job: self.cfg.job.clone(),
            node: self.cfg.node.clone(),
            vm: vm.vm.clone(),
            host,
            guest,
            errors,
        }
    }

    /// One sampling round: the node, then every VM. VMs that left are forgotten so their
    /// counters do not leak.
    pub fn sample_all(
        &mut self,
        vms: &[VmProcess],
        guest: &mut dyn GuestSource,
    ) -> Result<Vec<Sample>, MonitorError> {
        let mut out = Vec::with_capacity(vms.len() + 1);
        out.push(Sample::Node(self.sample_node()?));
        self.prev_vm.retain(|id, _| vms.iter().any(|v| &v.vm == id));
        for vm in vms {
            out.push(Sample::Vm(self.sample_vm(vm, guest)));
        }
        Ok(out)
    }
}
