//! Monitoring hook (seed 000 §IV): a per-node sampler of `/proc` (node memory and per-core
//! utilisation) plus, per VM, both the host view (hypervisor process) and the guest view (the
//! guest agent's `/proc`), because seed 000 shows the two disagree and placement needs both.
//! Samples are typed and tagged job/node/VM; exporters feed external hooks (JSON lines on a
//! command's stdin), Prometheus text exposition and LDMS-style CSV.

mod cgroup;
mod error;
mod export;
mod hook;
mod ids;
mod node_cgroup;
mod procfs;
mod sample;
mod sampler;

pub use cgroup::cgroup_meminfo;
pub use error::MonitorError;
pub use export::{LdmsCsv, LdmsSchema, json_line, prometheus_text};
pub use hook::CommandHook;
pub use ids::{IdError, JobId, NodeName, VmId};
pub use node_cgroup::{NodeCgroup, memory_cgroup_base};
pub use procfs::{CpuTimes, MemInfo, ProcessStat, parse_cpu_times, parse_meminfo, read_process};
pub use sample::{GuestView, HostView, NodeSample, Sample, VmSample};
pub use sampler::{GuestProc, GuestSource, NoGuest, Sampler, SamplerConfig, VmProcess};
