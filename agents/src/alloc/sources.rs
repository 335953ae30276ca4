//! Allocation sources and the node list they yield.

use super::hostlist::{self, HostlistError};
use std::{collections::HashMap, path::PathBuf, str::FromStr};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AllocError {
    #[error("unknown allocation `{0}`: expected slurm, pbs, hostfile:FILE or local[:N]")]
    UnknownSource(String),
    #[error("`local:{0}`: expected a number of agents between 1 and 4096")]
    BadLocalCount(String),
    #[error(
        "{var} is not set: not inside a {what} allocation; hint: use --allocation local[:N] to try it out"
    )]
    MissingEnv {
        var: &'static str,
        what: &'static str,
    },
    #[error("{var}: {source}")]
    Hostlist {
        var: &'static str,
        source: HostlistError,
    },
    #[error("{var}=`{value}`: expected counts like `4(x3),2`")]
    BadCpuList { var: &'static str, value: String },
    #[error("{path}:{line}:{column}: {what}")]
    File {
        path: String,
        line: usize,
        column: usize,
        what: String,
    },
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot resolve host `{host}`: {reason}; hint: give `addr=IP` in the host file")]
    Resolve { host: String, reason: String },
    #[error("{path}: no hosts listed")]
    NoHosts { path: String },
}

/// The allocation named by `--allocation` or the batch system's environment is input.
impl vse_exit::Classify for AllocError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// How agents reach the nodes of this allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `srun --overlap -N1 -w HOST` (inside a Slurm allocation).
    Srun,
    /// `ssh HOST` (PBS or plain host file).
    Ssh,
    /// A child process on this machine.
    Local,
}

/// `--allocation` as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocationSource {
    Slurm,
    Pbs,
    Hostfile(PathBuf),
    Local(u32),
}

impl FromStr for AllocationSource {
    type Err = AllocError;
    fn from_str(s: &str) -> Result<Self, AllocError> {
        match s {
            "slurm" => Ok(Self::Slurm),
            "pbs" | "torque" => Ok(Self::Pbs),
            "local" => Ok(Self::Local(1)),
            _ => {
                if let Some(path) = s.strip_prefix("hostfile:").filter(|p| !p.is_empty()) {
                    Ok(Self::Hostfile(path.into()))
                } else if let Some(n) = s.strip_prefix("local:") {
                    match n.parse::<u32>() {
                        Ok(n) if (1..=4096).contains(&n) => Ok(Self::Local(n)),
                        _ => Err(AllocError::BadLocalCount(n.to_string())),
                    }
                } else {
                    Err(AllocError::UnknownSource(s.to_string()))
                }
            }
        }
    }
}

/// One node of the allocation and the CPUs the job may use on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeSlot {
    pub host: String,
    pub cpus: u32,
    /// Address the node's agent listens on, when the host file gives one (`addr=IP`);
    /// otherwise the host name is resolved.
    pub addr: Option<std::net::IpAddr>,
    /// The memory (MiB) the batch system lets the job use on this node, when it bounds it
    /// (Slurm's `--mem`, `--mem-per-cpu` or the cluster's default, enforced by its cgroups).
    pub memory_mib: Option<u64>,
}

impl NodeSlot {
    pub fn new(host: impl Into<String>, cpus: u32) -> Self {
        Self {
            host: host.into(),
            cpus,
            addr: None,
            memory_mib: None,
        }
    }

    /// The agent address: `addr=`, a literal IP host, or the name resolved (first IPv4 first).
    pub fn resolve(&self) -> Result<std::net::IpAddr, AllocError> {
        if let Some(a) = self.addr {
            return Ok(a);
        }
        if let Ok(a) = self.host.parse() {
            return Ok(a);
        }
        use std::net::ToSocketAddrs;
        let addrs: Vec<_> = (self.host.as_str(), 0)
            .to_socket_addrs()
            .map_err(|e| AllocError::Resolve {
                host: self.host.clone(),
                reason: e.to_string(),
            })?
            .map(|s| s.ip())
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| AllocError::Resolve {
                host: self.host.clone(),
                reason: "no address".into(),
            })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub nodes: Vec<NodeSlot>,
    pub launcher: Launcher,
}

impl Allocation {
    /// Reads the allocation from `env` (the process environment in production, a map in tests).
    pub fn detect(
        source: &AllocationSource,
        env: &HashMap<String, String>,
    ) -> Result<Self, AllocError> {
        match source {
            AllocationSource::Slurm => from_slurm(env),
            AllocationSource::Pbs => {
                let path = env.get("PBS_NODEFILE").ok_or(AllocError::MissingEnv {
                    var: "PBS_NODEFILE",
                    what: "PBS/Torque",
                })?;
                let text = read(path)?;
                Ok(Self {
                    nodes: parse_pbs_nodefile(&text, path)?,
                    launcher: Launcher::Ssh,
                })
            }
            AllocationSource::Hostfile(path) => {
                let path = path.display().to_string();
                let text = read(&path)?;
                Ok(Self {
                    nodes: parse_hostfile(&text, &path)?,
                    launcher: Launcher::Ssh,
                })
            }
            AllocationSource::Local(n) => {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
                let nodes = (0..*n)
                    .map(|_| NodeSlot {
                        addr: Some([127, 0, 0, 1].into()),
                        ..NodeSlot::new("localhost", cpus)
                    })
                    .collect();
                Ok(Self {
                    nodes,
                    launcher: Launcher::Local,
                })
            }
        }
    }
}

fn read(path: &str) -> Result<String, AllocError> {
    std::fs::read_to_string(path).map_err(|source| AllocError::Io {
        path: path.into(),
        source,
    })
}

fn from_slurm(env: &HashMap<String, String>) -> Result<Allocation, AllocError> {
    let (var, list) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|v| env.get(v).map(|l| (v, l)))
        .ok_or(AllocError::MissingEnv {
            var: "SLURM_JOB_NODELIST",
            what: "Slurm",
        })?;
    let hosts = hostlist::expand(list).map_err(|source| AllocError::Hostlist { var, source })?;
    let cpus = match env.get("SLURM_JOB_CPUS_PER_NODE") {
        Some(v) => parse_cpus_per_node(v).ok_or_else(|| AllocError::BadCpuList {
            var: "SLURM_JOB_CPUS_PER_NODE",
            value: v.clone(),
        })?,
        None => Vec::new(),
    };
    let fallback = env
        .get("SLURM_CPUS_ON_NODE")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let nodes = hosts
        .into_iter()
        .enumerate()
        .map(|(i, host)| NodeSlot::new(host, cpus.get(i).copied().unwrap_or(fallback)))
        .collect();
    let mut nodes: Vec<NodeSlot> = nodes;
    // Node names need not be in DNS (e.g. several slurmd on one host): Slurm knows the address.
    let addrs = slurm_node_addrs();
    let memory = slurm_job_memory(env);
    for n in &mut nodes {
        n.addr = addrs.get(&n.host).copied();
        n.memory_mib = memory.map(|m| m.on(n.cpus));
    }
    Ok(Allocation {
        nodes,
        launcher: Launcher::Srun,
    })
}

/// The job's memory on a node, as Slurm gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobMemory {
    PerNode(u64),
    PerCpu(u64),
}

impl JobMemory {
    fn on(self, cpus: u32) -> u64 {
        match self {
            JobMemory::PerNode(m) => m,
            JobMemory::PerCpu(m) => m * u64::from(cpus),
        }
    }
}

/// From the job's environment (`--mem`, `--mem-per-cpu` given), else from its record in
/// slurmctld (a cluster's `DefMemPerCPU`/`DefMemPerNode`); `None` when memory is unbounded.
fn slurm_job_memory(env: &HashMap<String, String>) -> Option<JobMemory> {
    let from_env = |var: &str| env.get(var).and_then(|v| parse_slurm_mib(v));
    if let Some(m) = from_env("SLURM_MEM_PER_NODE") {
        return Some(JobMemory::PerNode(m));
    }
    if let Some(m) = from_env("SLURM_MEM_PER_CPU") {
        return Some(JobMemory::PerCpu(m));
    }
    let job = env.get("SLURM_JOB_ID")?;
    let out = std::process::Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .output()
        .ok()?;
    parse_scontrol_job_memory(&String::from_utf8_lossy(&out.stdout))
}

/// `MinMemoryNode=700M` or `MinMemoryCPU=2G` of `scontrol show job -o`.
pub(crate) fn parse_scontrol_job_memory(text: &str) -> Option<JobMemory> {
    let line = text.lines().next()?;
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(parse_slurm_mib)
    };
    (field("MinMemoryNode=").map(JobMemory::PerNode))
        .or_else(|| field("MinMemoryCPU=").map(JobMemory::PerCpu))
}

/// A Slurm memory size in MiB: `700`, `700M`, `2G`, `1T`; 0 (the whole node) is no bound.
fn parse_slurm_mib(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    let shift = match unit {
        "" | "M" => 0,
        "G" => 10,
        "T" => 20,
        _ => return None,
    };
    num.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .map(|n| n << shift)
}

/// `NodeName -> NodeAddr` from `scontrol show node -o`; empty when scontrol is unavailable.
fn slurm_node_addrs() -> HashMap<String, std::net::IpAddr> {
    let Ok(out) = std::process::Command::new("scontrol")
        .args(["show", "node", "-o"])
        .output()
    else {
        return HashMap::new();
    };
    parse_scontrol_nodes(&String::from_utf8_lossy(&out.stdout))
}

pub(crate) fn parse_scontrol_nodes(text: &str) -> HashMap<String, std::net::IpAddr> {
    let mut map = HashMap::new();
    for line in text.lines() {
        let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k));
        if let (Some(name), Some(Ok(a))) = (field("NodeName="), field("NodeAddr=").map(str::parse))
        {
            map.insert(name.to_string(), a);
        }
    }
    map
}

/// `SLURM_JOB_CPUS_PER_NODE`: `72(x2),36` means 72, 72, 36.
pub(crate) fn parse_cpus_per_node(v: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for item in v.split(',') {
        let (count, rep) = match item.split_once("(x") {
            Some((c, r)) => (c, r.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (item, 1),
        };
        let count: u32 = count.trim().parse().ok()?;
        out.extend(std::iter::repeat_n(count, rep.min(hostlist::MAX_HOSTS)));
    }
    Some(out)
}

/// PBS node files list a host once per slot; order of first appearance is kept.
fn parse_pbs_nodefile(text: &str, path: &str) -> Result<Vec<NodeSlot>, AllocError> {
    let mut nodes: Vec<NodeSlot> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let host = line.trim();
        if host.is_empty() {
            continue;
        }
        check_host(host, path, i + 1, line.find(host).unwrap_or(0) + 1)?;
        match nodes.iter_mut().find(|n| n.host == host) {
            Some(n) => n.cpus += 1,
            None => nodes.push(NodeSlot::new(host, 1)),
        }
    }
    if nodes.is_empty() {
        return Err(AllocError::NoHosts { path: path.into() });
    }
    Ok(nodes)
}

/// Host file: `host [slots=N] [addr=IP]` per line, `#` comments.
fn parse_hostfile(text: &str, path: &str) -> Result<Vec<NodeSlot>, AllocError> {
    let mut nodes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(host) = words.next() else { continue };
        let col = |w: &str| raw.find(w).unwrap_or(0) + 1;
        check_host(host, path, i + 1, col(host))?;
        let mut node = NodeSlot::new(host, 1);
        for w in words {
            let bad = |what: String| AllocError::File {
                path: path.into(),
                line: i + 1,
                column: col(w),
                what,
            };
            if let Some(a) = w.strip_prefix("addr=") {
                node.addr = Some(
                    a.parse()
                        .map_err(|_| bad(format!("`{a}` is not an IP address")))?,
                );
                continue;
            }
            let n = w
                .strip_prefix("slots=")
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n > 0);
            node.cpus = n.ok_or_else(|| {
                bad(format!(
                    "unexpected `{w}`: expected `slots=N` with N >= 1 or `addr=IP`"
                ))
            })?;
        }
        nodes.push(node);
    }
    if nodes.is_empty() {
        return Err(AllocError::NoHosts { path: path.into() });
    }
    Ok(nodes)
}

fn check_host(host: &str, path: &str, line: usize, column: usize) -> Result<(), AllocError> {
    let ok = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(AllocError::File {
            path: path.into(),
            line,
            column,
            what: format!("`{host}` is not a host name: expected letters, digits, `-`, `.`, `_`"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn source_parsing() {
        assert_eq!(
            "slurm".parse::<AllocationSource>().unwrap(),
            AllocationSource::Slurm
        );
        assert_eq!(
            "local:3".parse::<AllocationSource>().unwrap(),
            AllocationSource::Local(3)
        );
        assert!("local:0".parse::<AllocationSource>().is_err());
        assert!("hostfile:".parse::<AllocationSource>().is_err());
        assert!("lsf".parse::<AllocationSource>().is_err());
    }

    #[test]
    fn the_job_s_memory_comes_from_its_environment_or_its_record() {
        assert_eq!(parse_slurm_mib("700"), Some(700));
        assert_eq!(parse_slurm_mib("2G"), Some(2048));
        assert_eq!(parse_slurm_mib("0"), None);
        assert_eq!(parse_slurm_mib("2X"), None);
        let env: HashMap<String, String> = [("SLURM_MEM_PER_CPU", "512")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(slurm_job_memory(&env).map(|m| m.on(3)), Some(1536));
        let line = "JobId=7 JobName=sh MinCPUsNode=1 MinMemoryCPU=2G MinTmpDiskNode=0";
        assert_eq!(
            parse_scontrol_job_memory(line),
            Some(JobMemory::PerCpu(2048))
        );
        let line = "JobId=7 MinMemoryNode=700M";
        assert_eq!(
            parse_scontrol_job_memory(line),
            Some(JobMemory::PerNode(700))
        );
        assert_eq!(parse_scontrol_job_memory("JobId=7 MinMemoryNode=0"), None);
    }

    #[test]
    fn slurm_env() {
        let e = env(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_JOB_CPUS_PER_NODE", "4(x2),2"),
        ]);
        let a = Allocation::detect(&AllocationSource::Slurm, &e).unwrap();
        let got: Vec<_> = a.nodes.iter().map(|n| (n.host.as_str(), n.cpus)).collect();
        assert_eq!(got, [("n1", 4), ("n2", 4), ("n3", 2)]);
        assert_eq!(a.launcher, Launcher::Srun);
        let err = Allocation::detect(&AllocationSource::Slurm, &env(&[])).unwrap_err();
        assert!(
            err.to_string().contains("SLURM_JOB_NODELIST is not set"),
            "{err}"
        );
    }

    #[test]
    fn pbs_nodefile_counts_slots() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nodes");
        std::fs::write(&p, "a\na\nb\n\n").unwrap();
        let e = env(&[("PBS_NODEFILE", p.to_str().unwrap())]);
        let a = Allocation::detect(&AllocationSource::Pbs, &e).unwrap();
        assert_eq!(a.nodes, [NodeSlot::new("a", 2), NodeSlot::new("b", 1)]);
    }

    #[test]
    fn hostfile_errors_point_at_the_column() {
        let err = parse_hostfile("# c\nh1 slots=2\nh2 slots=x\n", "hf").unwrap_err();
        assert_eq!(
            err.to_string(),
            "hf:3:4: unexpected `slots=x`: expected `slots=N` with N >= 1 or `addr=IP`"
        );
        let ok = parse_hostfile("h1 slots=2 # big\nh2 addr=10.1.0.2\n", "hf").unwrap();
        assert_eq!(
            ok[1].resolve().unwrap(),
            "10.1.0.2".parse::<std::net::IpAddr>().unwrap()
        );
        let bad = parse_hostfile("h1 addr=x\n", "hf").unwrap_err().to_string();
        assert!(bad.starts_with("hf:1:4:"), "{bad}");
        assert_eq!(ok[0].cpus, 2);
        assert_eq!(ok[1].cpus, 1);
        assert!(
            parse_hostfile("h$ x\n", "hf")
                .unwrap_err()
                .to_string()
                .starts_with("hf:1:1:")
        );
    }

    #[test]
    fn scontrol_node_addresses() {
        let m = parse_scontrol_nodes(
            "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost\nNodeName=n2 NodeAddr=bad\n",
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m["n1"], std::net::IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn cpus_per_node() {
        assert_eq!(parse_cpus_per_node("72(x2),36"), Some(vec![72, 72, 36]));
        assert_eq!(parse_cpus_per_node("x"), None);
    }
}
