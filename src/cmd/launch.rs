//! `vse launch IMAGE [--vms-per-node K] [--hypervisor H] [--policy P]... [--allocation A]
//! [--mpi] [--json] -- CMD ARGS`: inside an allocation, start one agent per node, stage the
//! image to every node, boot K VMs per node (pinned to distinct cores), run CMD in each with
//! VSE_RANK, VSE_SIZE and VSE_HOSTS set, print every rank's output prefixed `[rank N] `, tear
//! everything down and exit with the job's status.
//!
//! Exit codes: the status of the lowest failing rank (0 when all succeeded); 101 an agent or
//! node failed, 102 staging failed, 103 a VM could not run the command; 2 invalid input.
//!
//! The VMs of a job share a private L2 segment (a virtio-net NIC each, frames carried over
//! UDP to a switch in this process; see `launcher::net`), 10.251.0.0/16 or the policy's
//! `network.ip_range`, with /etc/hosts naming every VM. `--mpi` runs CMD under mpirun in
//! rank 0's VM, which reaches the others through the guest agents' rsh service.

mod move_vm;
pub mod node;
mod watch;

use super::agent::{JobSetup, job_config};
use crate::exit::InvalidInput;
use anyhow::{Context, Result, anyhow};
use clap::Args;
use launcher::{
    agent::{OnFailure, Timing},
    launch::{
        ControlOptions, LaunchEvent, LaunchRequest, LinePrefixer, MonitorRequest, launch_blocking,
    },
    proto::Stream,
    stage::StageOptions,
};
use std::{collections::HashMap, io::Write, path::PathBuf, process::ExitCode, time::Duration};

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// An image directory written by `vse build`, or a spec (`*.vse.yaml`): checked, locked
    /// and built under the policies first (an unchanged spec is a cache hit).
    pub image: PathBuf,
    /// VMs to boot on every node (one rank each).
    #[arg(long, default_value_t = 1)]
    pub vms_per_node: u32,
    /// Virtual CPUs per VM (each pinned to its own host core while the node has enough).
    /// Default: the spec's `resources.vcpus` when launching a spec, else 1.
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Guest memory per VM in MiB. Default: the spec's `resources.memory`, else 256.
    #[arg(long)]
    pub memory: Option<u64>,
    /// V2M backend on the nodes: auto, qemu or libvirt.
    #[arg(long, default_value = "auto")]
    pub hypervisor: String,
    /// Admin policy (`*.policy.yaml`); repeat to stack. Its limits bound vCPUs, memory and
    /// VMs per core.
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<PathBuf>,
    /// Where the nodes come from: slurm, pbs, hostfile:FILE or local[:N].
    #[arg(long, default_value = "slurm")]
    pub allocation: String,
    /// Fan-out of the agent and staging tree.
    #[arg(long, default_value_t = 2)]
    pub fanout: u32,
    /// Address the front-end listens on (default: loopback for local allocations).
    #[arg(long)]
    pub listen: Option<std::net::IpAddr>,
    /// Write a hostfile of the VMs and run CMD under mpirun in rank 0's VM.
    #[arg(long)]
    pub mpi: bool,
    /// Boot the VMs without the job's private network (no NIC).
    #[arg(long, conflicts_with = "mpi")]
    pub no_network: bool,
    /// Print one JSON report (ranks, statuses, output, staging, failures) instead of the
    /// prefixed output.
    #[arg(long)]
    pub json: bool,
    /// The controller's state database (nodes, VMs, placement, samples, migrations; read it
    /// with `vse status --db`). Default: $VSE_STATE_DB, else `<run dir>/<job>.state.db`.
    #[arg(long, value_name = "PATH")]
    pub state_db: Option<PathBuf>,
    /// How often every node agent samples its node and VMs, e.g. `1s`, `500ms`.
    #[arg(long, value_name = "PERIOD", default_value = "1s", value_parser = parse_period)]
    pub sample_period: Duration,
    /// Shell command that gets every sample as a JSON line on its stdin.
    #[arg(long, value_name = "CMD")]
    pub monitor_hook: Option<String>,
    /// Keep the latest samples in this file in Prometheus text format.
    #[arg(long, value_name = "FILE")]
    pub export_prom: Option<PathBuf>,
    /// Simulation mode for `local:N` (all nodes share this machine and its /proc/meminfo):
    /// give each node agent a memory cgroup of this many MiB that holds its VMs and stands
    /// for the node's memory. Needs root and a memory cgroup.
    #[arg(long, value_name = "MiB")]
    pub node_memory: Option<u64>,
    /// Keep the last N nodes of the allocation free: no VMs, the destinations of migrations.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub spare_nodes: u32,
    /// The command to run in every VM, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<String>,
}

fn invalid(msg: String) -> anyhow::Error {
    anyhow!(InvalidInput(msg))
}

/// `1s`, `250ms`, `2` (seconds), `0.5s`.
fn parse_period(s: &str) -> Result<Duration, String> {
    let (num, scale) = match s.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected a duration such as 1s or 500ms"))?;
    let d = Duration::from_secs_f64((v * scale).max(0.0));
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("`{s}`: expected between 100ms and 1h"));
    }
    Ok(d)
}

/// The migration daemon's settings when the stacked policies have a `migration` section
/// (every rule then runs with the policy's thresholds; consolidation only if it says so).
fn migration(paths: &[PathBuf]) -> Result<Option<launcher::migrate::MigrationConfig>> {
    let pols = paths
        .iter()
        .map(|p| vsec::policy::load(p).map_err(|e| invalid(format!("{e}"))))
        .collect::<Result<Vec<_>>>()?;
    let (st, _) = vsec::merge::stack(&pols);
    if st.migration == vsec::policy::MigrationRules::default() {
        return Ok(None);
    }
    let m = vsec::merge::migration(&st);
    launcher::migrate::migration_config(&m)
        .map(Some)
        .map_err(|e| invalid(format!("policy: {e}")))
}

fn run_dir() -> PathBuf {
    std::env::var_os("VSE_RUN_DIR").map_or_else(|| "/run/vse/v2m".into(), PathBuf::from)
}

/// What the stacked policies allow.
struct Limits {
    vcpus: Option<u32>,
    memory_mib: Option<u64>,
    per_core: u32,
    /// The job network's range: the last policy that sets one wins (IPv4 only).
    network: Option<(std::net::Ipv4Addr, u8)>,
}

/// The tightest limits of the stacked policies.
fn policy_limits(paths: &[PathBuf]) -> Result<Limits> {
    let (mut vcpus, mut mem, mut per_core) = (None::<u32>, None::<u64>, 1u32);
    let mut seen_per_core = false;
    let mut network = None;
    for p in paths {
        let pol = vsec::policy::load(p).map_err(|e| invalid(format!("{e}")))?;
        if let Some(n) = &pol.network {
            let range = &n.ip_range.value;
            match range.network() {
                std::net::IpAddr::V4(base) => network = Some((base, range.prefix_len())),
                std::net::IpAddr::V6(_) => {
                    return Err(invalid(format!(
                        "{}: network.ip_range {range}: the job network is IPv4; hint: give an IPv4 range",
                        n.ip_range.at
                    )));
                }
            }
        }
        if let Some(v) = &pol.max_vcpus {
            vcpus = Some(vcpus.map_or(v.value, |c| c.min(v.value)));
        }
        if let Some(m) = &pol.max_memory {
            let mib = m.value.bytes() >> 20;
            mem = Some(mem.map_or(mib, |c| c.min(mib)));
        }
        if let Some(v) = &pol.vms_per_core {
            per_core = if seen_per_core {
                per_core.min(v.value)
            } else {
                v.value
            };
            seen_per_core = true;
        }
    }
    Ok(Limits {
        vcpus,
        memory_mib: mem,
        per_core,
        network,
    })
}

pub fn run(mut a: LaunchArgs) -> Result<ExitCode> {
    if !matches!(a.hypervisor.as_str(), "auto" | "qemu" | "libvirt") {
        return Err(invalid(format!(
            "--hypervisor {}: expected auto, qemu or libvirt",
            a.hypervisor
        )));
    }
    let (mut vcpus, mut memory) = (1, 256);
    if a.image.is_file() && super::build::is_spec(&a.image) {
        let (image, env) = super::build::image_for_spec(&a.image, &a.policies, a.json)?;
        a.image = image;
        vcpus = env.resources.vcpus.value;
        memory = env.resources.memory.value.bytes() >> 20;
    }
    let (vcpus, memory) = (a.vcpus.unwrap_or(vcpus), a.memory.unwrap_or(memory));
    vse_image::ImageDir::open(&a.image).map_err(|e| invalid(e.to_string()))?;
    let Limits {
        vcpus: max_vcpus,
        memory_mib: max_mem,
        per_core,
        network,
    } = policy_limits(&a.policies)?;
    let network = (!a.no_network).then(|| {
        network.unwrap_or((
            launcher::net::JobNet::DEFAULT_BASE,
            launcher::net::JobNet::DEFAULT_PREFIX,
        ))
    });
    if let Some(v) = max_vcpus.filter(|v| vcpus > *v) {
        return Err(invalid(format!(
            "--vcpus {}: the policy allows at most {v}",
            vcpus
        )));
    }
    if let Some(mm) = max_mem.filter(|mm| memory > *mm) {
        return Err(invalid(format!(
            "--memory {}: the policy allows at most {mm} MiB",
            memory
        )));
    }
    if memory < 128 || a.fanout == 0 {
        return Err(invalid(
            "--memory must be at least 128 (MiB) and --fanout at least 1".into(),
        ));
    }
    let local = a.allocation == "local" || a.allocation.starts_with("local:");
    if a.node_memory.is_some() && !local {
        return Err(invalid(
            "--node-memory is the simulation mode of local allocations (agents sharing one \
             machine); real nodes are sampled through their own /proc; hint: drop it"
                .into(),
        ));
    }
    if a.node_memory
        .is_some_and(|m| m < memory * u64::from(a.vms_per_node))
    {
        return Err(invalid(format!(
            "--node-memory {} MiB cannot hold {} VM(s) of {} MiB",
            a.node_memory.unwrap_or(0),
            a.vms_per_node,
            memory
        )));
    }
    let exe = std::env::current_exe().context("cannot find the vse executable")?;
    let (cfg, alloc) = job_config(&JobSetup {
        allocation: &a.allocation,
        listen: a.listen,
        k: a.fanout,
        timing: Timing {
            // VM boots load the machine: a generous timeout avoids false failure reports.
            handshake: Duration::from_secs(30),
            heartbeat: Duration::from_millis(500),
            timeout: Duration::from_secs(10),
        },
        on_failure: OnFailure::Abort,
        remote: None,
        exe,
        overlay: true,
    })?;
    let job_name = format!("j{}", std::process::id());
    let state_db = a
        .state_db
        .clone()
        .or_else(|| std::env::var_os("VSE_STATE_DB").map(PathBuf::from))
        .unwrap_or_else(|| run_dir().join(format!("{job_name}.state.db")));
    let migration = migration(&a.policies)?;
    if migration.is_some() && a.hypervisor == "libvirt" {
        return Err(invalid(
            "--hypervisor libvirt: the policy's migration section needs VMs the node agents \
             can live-migrate themselves; hint: use --hypervisor qemu (or auto)"
                .into(),
        ));
    }
    let monitor = MonitorRequest {
        migration,
        period: a.sample_period,
        node_memory_mib: a.node_memory,
        control: ControlOptions {
            db: state_db,
            hook: a
                .monitor_hook
                .as_ref()
                .map(|c| vec!["/bin/sh".into(), "-c".into(), c.clone()]),
            prom: a.export_prom.clone(),
        },
    };
    let req = LaunchRequest {
        image: std::path::absolute(&a.image)?,
        argv: a.cmd.clone(),
        vms_per_node: a.vms_per_node,
        vcpus,
        memory_mib: memory,
        vms_per_core: per_core,
        // VMs the daemon may move are QEMU's: node agents migrate them with V2M's QEMU plugin.
        hypervisor: if monitor.migration.is_some() {
            "qemu".into()
        } else {
            a.hypervisor.clone()
        },
        job_name,
        cpus: alloc.nodes.iter().map(|n| n.cpus).collect(),
        shared_machine: alloc.launcher == launcher::alloc::Launcher::Local,
        stage: StageOptions::default(),
        network,
        mpi: a.mpi,
        spare_nodes: a.spare_nodes,
        monitor: Some(monitor),
    };
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let mut prefixers: HashMap<(u32, bool), LinePrefixer> = HashMap::new();
    let mut captured: HashMap<(u32, bool), String> = HashMap::new();
    let json = a.json;
    let report = launch_blocking(cfg, req, |e| match e {
        LaunchEvent::Phase(p) => {
            if let Some(b) = &bar {
                b.set_message(p);
            }
        }
        LaunchEvent::Output { rank, stream, text } => {
            let err = stream == Stream::Stderr;
            if json {
                captured.entry((rank, err)).or_default().push_str(&text);
                return;
            }
            let lines = prefixers.entry((rank, err)).or_default().push(rank, &text);
            let print = || {
                if err {
                    let _ = std::io::stderr().write_all(lines.as_bytes());
                } else {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(lines.as_bytes());
                    let _ = o.flush();
                }
            };
            match &bar {
                Some(b) => b.suspend(print),
                None => print(),
            }
        }
    })
    .map_err(|e| match e {
        launcher::launch::LaunchError::Runtime(_) => anyhow!(e),
        other => invalid(other.to_string()),
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if json {
        let ranks: Vec<_> = report
            .ranks
            .iter()
            .map(|r| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["stdout"] = captured.remove(&(r.rank, false)).unwrap_or_default().into();
                v["stderr"] = captured.remove(&(r.rank, true)).unwrap_or_default().into();
                v
            })
            .collect();
        let mut v = serde_json::to_value(&report)?;
        v["ranks"] = ranks.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for ((rank, err), mut p) in prefixers {
            let rest = p.finish(rank);
            if err {
                eprint!("{rest}");
            } else {
                print!("{rest}");
            }
        }
        for r in report.ranks.iter().filter(|r| r.error.is_some()) {
            eprintln!(
                "vse launch: rank {} ({} on {}): {}",
                r.rank,
                r.vm,
                r.host,
                r.error.as_deref().unwrap_or_default()
            );
        }
        for f in &report.failures {
            eprintln!(
                "vse launch: {} failed: {} (seen by {})",
                f.node, f.reason, f.by
            );
        }
        for e in report.monitor.iter().flat_map(|m| &m.errors) {
            eprintln!("vse launch: monitoring: {e}");
        }
        if report.exit_code != 0 {
            eprintln!("vse launch: exit {}: {}", report.exit_code, report.reason);
        }
    }
    Ok(ExitCode::from(report.exit_code))
}
