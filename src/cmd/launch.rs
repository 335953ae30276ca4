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

pub mod node;

use super::agent::{JobSetup, job_config};
use crate::exit::InvalidInput;
use anyhow::{Context, Result, anyhow};
use clap::Args;
use launcher::{
    agent::{OnFailure, Timing},
    launch::{LaunchEvent, LaunchRequest, LinePrefixer, launch_blocking},
    proto::Stream,
    stage::StageOptions,
};
use std::{collections::HashMap, io::Write, path::PathBuf, process::ExitCode, time::Duration};

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Image directory written by `vse build`.
    pub image: PathBuf,
    /// VMs to boot on every node (one rank each).
    #[arg(long, default_value_t = 1)]
    pub vms_per_node: u32,
    /// Virtual CPUs per VM (each pinned to its own host core while the node has enough).
    #[arg(long, default_value_t = 1)]
    pub vcpus: u32,
    /// Guest memory per VM in MiB.
    #[arg(long, default_value_t = 256)]
    pub memory: u64,
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
    /// The command to run in every VM, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<String>,
}

fn invalid(msg: String) -> anyhow::Error {
    anyhow!(InvalidInput(msg))
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

pub fn run(a: LaunchArgs) -> Result<ExitCode> {
    if !matches!(a.hypervisor.as_str(), "auto" | "qemu" | "libvirt") {
        return Err(invalid(format!(
            "--hypervisor {}: expected auto, qemu or libvirt",
            a.hypervisor
        )));
    }
    let m = imgbuild::manifest::Manifest::read(&a.image).ok_or_else(|| {
        invalid(format!(
            "{}: no readable manifest.json; expected an image directory written by `vse build`",
            a.image.display()
        ))
    })?;
    if !m.parts_present(&a.image) {
        return Err(invalid(format!(
            "{}: image is incomplete; hint: rebuild it with `vse build`",
            a.image.display()
        )));
    }
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
    if let Some(v) = max_vcpus.filter(|v| a.vcpus > *v) {
        return Err(invalid(format!(
            "--vcpus {}: the policy allows at most {v}",
            a.vcpus
        )));
    }
    if let Some(mm) = max_mem.filter(|mm| a.memory > *mm) {
        return Err(invalid(format!(
            "--memory {}: the policy allows at most {mm} MiB",
            a.memory
        )));
    }
    if a.memory < 128 || a.fanout == 0 {
        return Err(invalid(
            "--memory must be at least 128 (MiB) and --fanout at least 1".into(),
        ));
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
    let req = LaunchRequest {
        image: std::path::absolute(&a.image)?,
        argv: a.cmd.clone(),
        vms_per_node: a.vms_per_node,
        vcpus: a.vcpus,
        memory_mib: a.memory,
        vms_per_core: per_core,
        hypervisor: a.hypervisor.clone(),
        job_name: format!("j{}", std::process::id()),
        cpus: alloc.nodes.iter().map(|n| n.cpus).collect(),
        shared_machine: alloc.launcher == launcher::alloc::Launcher::Local,
        stage: StageOptions::default(),
        network,
        mpi: a.mpi,
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
        if report.exit_code != 0 {
            eprintln!("vse launch: exit {}: {}", report.exit_code, report.reason);
        }
    }
    Ok(ExitCode::from(report.exit_code))
}
