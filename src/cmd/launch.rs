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

use super::launch_ckpt::CheckpointFlags;
use crate::exit::invalid;
use agents::agent::{AgentConfig, OnFailure, Timing};
use agents::alloc::Allocation;
use anyhow::{Context, Result};
use clap::Args;
use control::migrate::MigrationConfig;
use launcher::{
    job::{JobSetup, job_config},
    launch::{
        ControlOptions, Hostnames, LaunchEvent, LaunchReport, LaunchRequest, LinePrefixer,
        MonitorRequest, Sizes, check_job_memory, check_request, launch_blocking,
    },
    net::JobNet,
    stage::StageOptions,
    wire::Stream,
};
use std::{collections::HashMap, io::Write, path::PathBuf, process::ExitCode, time::Duration};
use vse_guest_agent::share::server::Shared;
use vsec::{env::EffectiveEnv, launch::LaunchRules, units::Hypervisor};

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
    /// Address the front-end (its agent, the staging source and the job network's switch)
    /// listens on; the nodes must reach it. Default: loopback when a node is on loopback
    /// (local allocations), else this machine's address on the route to the first node.
    /// A wildcard address is refused.
    #[arg(long, env = "VSE_LISTEN", value_name = "IP")]
    pub listen: Option<std::net::IpAddr>,
    /// Write a hostfile of the VMs and run CMD under mpirun in rank 0's VM.
    #[arg(long)]
    pub mpi: bool,
    /// Boot the VMs without the job's private network (no NIC).
    #[arg(long, conflicts_with = "mpi")]
    pub no_network: bool,
    /// Boot every VM from its kernel: neither start from the nodes' boot templates of the
    /// image nor save one (a policy's `images.boot_templates: false` does the same).
    #[arg(long)]
    pub no_template: bool,
    /// Run the command as the guest's root instead of as you (needs a site policy granting
    /// `users.allow_root`).
    #[arg(long)]
    pub guest_root: bool,
    /// Share a host directory with every VM (repeatable): HOST[:GUEST][:ro]. GUEST
    /// defaults to HOST; the site's `shares.*` policy bounds what may be shared.
    #[arg(long = "share", value_name = "HOST[:GUEST][:ro]")]
    pub shares: Vec<String>,
    /// Leave out the shares every job gets by default (the working directory, unless the
    /// site's `shares.default` says otherwise).
    #[arg(long)]
    pub no_default_shares: bool,
    /// Give rank 0's command no input (as `< /dev/null`); by default it reads this
    /// command's standard input, as `srun` gives its own to task 0.
    #[arg(long)]
    pub no_stdin: bool,
    /// Print one JSON report (ranks, statuses, output, staging, failures) instead of the
    /// prefixed output.
    #[arg(long)]
    pub json: bool,
    /// The controller's state database (nodes, VMs, placement, samples, migrations; read it
    /// with `vse status --db DB`). Default: $VSE_STATE_DB, else `<run dir>/<job>.state.db`.
    #[arg(long, value_name = "PATH")]
    pub state_db: Option<PathBuf>,
    /// Name the job (1-24 of a-z, 0-9 and '-', starting with a letter), for `vse evacuate
    /// NODE --job ID`, `vse status` and its VMs' names. Default: `j<pid of this process>`.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// How often every node agent samples its node and VMs, e.g. `1s`, `500ms`.
    #[arg(long, value_name = "PERIOD", default_value = "1s", value_parser = parse_period)]
    pub sample_period: Duration,
    /// Shell command that gets every sample as a JSON line on its stdin.
    #[arg(long, value_name = "CMD")]
    pub monitor_hook: Option<String>,
    /// Seconds the job's VMs outlive this process if it dies, for `vse attach --job ID` (0:
    /// they end with it). Default 60, never more than the policies' `checkpoint.attach_grace`.
    #[arg(long, value_name = "SECONDS")]
    pub attach_grace: Option<u64>,
    /// Keep the latest samples in this file in Prometheus text format.
    #[arg(long, value_name = "FILE")]
    pub export_prom: Option<PathBuf>,
    /// Simulation mode for nodes sharing one machine and its /proc/meminfo (`local:N`, or a
    /// namespace test cluster with VSE_NODES_SHARE_MACHINE=1):
    /// give each node agent a memory cgroup of this many MiB that holds its VMs and stands
    /// for the node's memory. Needs root and a memory cgroup.
    #[arg(long, value_name = "MiB")]
    pub node_memory: Option<u64>,
    /// Keep the last N nodes of the allocation free: no VMs, the destinations of migrations.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub spare_nodes: u32,
    #[command(flatten)]
    pub ckpt: CheckpointFlags,
    /// The command to run in every VM, after `--` (a restored job's comes from its
    /// checkpoint).
    #[arg(last = true, required_unless_present = "restore", num_args = 1..)]
    pub cmd: Vec<String>,
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

/// The batch system's id of this job, for a hostname's `{job}`: this process's name for the
/// job outside one.
fn batch_job_id(job_name: &str) -> String {
    ["SLURM_JOB_ID", "PBS_JOBID"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        // A PBS id is `123.server`: only the number is a hostname label.
        .map(|v| v.split('.').next().unwrap_or_default().to_lowercase())
        .unwrap_or_else(|| job_name.to_string())
}

pub(super) fn run_dir() -> PathBuf {
    vse_base::run_root()
}

/// What the policies let this launch do: a spec's (with its effective environment, refused
/// as `vse check` refuses it), or the stacked policies' for an image (the same stacking, the
/// same diagnostics).
pub(super) fn rules(a: &LaunchArgs) -> Result<(LaunchRules, Option<EffectiveEnv>)> {
    if a.image.is_file() && super::build::is_spec(&a.image) {
        let env = super::envload::load_env(&a.image, &a.policies)?;
        let rules = LaunchRules::from_env(&env)
            .map_err(|problems| super::envload::reported(&a.image.display(), problems))?;
        return Ok((rules, Some(env)));
    }
    let what = a
        .policies
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let rules = super::envload::load_policies(&a.policies)?
        .and_then(|pols| LaunchRules::from_policies(&pols))
        .map_err(|problems| super::envload::reported(&format!("policies {what}"), problems))?;
    Ok((rules, None))
}

/// The sizes asked for (the spec's unless overridden), checked against the policies.
pub(super) fn sizes(
    a: &LaunchArgs,
    rules: &LaunchRules,
    env: Option<&EffectiveEnv>,
) -> Result<Sizes> {
    let (vcpus, memory) = env.map_or((1, 256), |env| {
        let r = &env.resources;
        (r.vcpus.value, r.memory.value.bytes() >> 20)
    });
    let sizes = Sizes {
        vcpus: a.vcpus.unwrap_or(vcpus),
        memory_mib: a.memory.unwrap_or(memory),
        vms_per_node: a.vms_per_node,
        fanout: a.fanout,
        node_memory_mib: a.node_memory,
        local: nodes_share_machine(&a.allocation),
    };
    check_request(rules, &sizes)?;
    Ok(sizes)
}

/// Whether the allocation's nodes are one machine: local agents, or a test cluster whose
/// nodes are namespaces of this machine and says so. They share its /proc/meminfo and its
/// cores, so each node's VMs get cores of their own (pinning every node's first VM to core 0
/// would stack them on one core).
fn nodes_share_machine(allocation: &str) -> bool {
    allocation == "local"
        || allocation.starts_with("local:")
        || std::env::var_os("VSE_NODES_SHARE_MACHINE").is_some_and(|v| v == "1")
}

/// Each node's cores; nodes sharing one machine all have the machine's (a test cluster's
/// batch system may say otherwise).
fn node_cpus(alloc: &agents::alloc::Allocation, shared: bool) -> Vec<u32> {
    let machine = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    (alloc.nodes.iter())
        .map(|n| if shared { machine } else { n.cpus })
        .collect()
}

/// How long a job outlives its `vse launch` process for `vse attach` unless told otherwise.
const ATTACH_GRACE: u64 = 60;

/// `--attach-grace`, within the policies' `checkpoint.attach_grace`.
pub(super) fn attach_grace(a: &LaunchArgs, rules: &LaunchRules) -> Result<Duration> {
    let max = rules
        .checkpoint
        .attach_grace
        .as_ref()
        .map(|g| g.value.get());
    let grace = match (a.attach_grace, max) {
        (Some(g), Some(m)) if g > m => {
            let at = (rules.checkpoint.attach_grace.as_ref())
                .map_or(String::new(), |s| format!("{}: ", s.from));
            return Err(invalid(format!(
                "--attach-grace {g}: the policies allow at most {m} s ({at}checkpoint.attach_grace)"
            )));
        }
        (Some(g), _) => g,
        (None, m) => m.map_or(ATTACH_GRACE, |m| m.min(ATTACH_GRACE)),
    };
    Ok(Duration::from_secs(grace))
}

/// The front-end's agents over the allocation.
fn agents(a: &LaunchArgs, orphan_grace: Duration) -> Result<(AgentConfig, Allocation)> {
    let exe = std::env::current_exe().context("cannot find the vse executable")?;
    Ok(job_config(&JobSetup {
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
        orphan_grace,
    })?)
}

/// The job's name: `--job`, checked (it prefixes VM names and host names), or this process's.
fn job_name(given: Option<&str>) -> Result<String> {
    let Some(id) = given else {
        return Ok(format!("j{}", std::process::id()));
    };
    let ok = (1..=24).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        return Err(invalid(format!(
            "--job {id:?}: expected 1-24 characters of a-z, 0-9 and '-', starting with a letter"
        )));
    }
    Ok(id.to_string())
}

/// A job name is one job's: a state database that knows it already (running or not) would
/// mix two jobs' placement and migrations.
fn fresh_job(db: &std::path::Path, job: &str) -> Result<()> {
    if !db.exists() {
        return Ok(());
    }
    let id = monitor::JobId::new(job).map_err(|e| invalid(format!("--job: {e}")))?;
    let sdb = control::state::StateDb::open(db)?;
    if !sdb.vms(Some(&id))?.is_empty() {
        return Err(invalid(format!(
            "--job {job}: {} already holds a job of that name; hint: pick another --job, or \
             remove the database of the finished job",
            db.display()
        )));
    }
    Ok(())
}

fn monitor(a: &LaunchArgs, job_name: &str, migration: Option<MigrationConfig>) -> MonitorRequest {
    let db = (a.state_db.clone())
        .or_else(|| std::env::var_os("VSE_STATE_DB").map(PathBuf::from))
        .unwrap_or_else(|| run_dir().join(format!("{job_name}.state.db")));
    let hook = (a.monitor_hook.as_ref()).map(|c| vec!["/bin/sh".into(), "-c".into(), c.clone()]);
    MonitorRequest {
        migration,
        period: a.sample_period,
        node_memory_mib: a.node_memory,
        control: ControlOptions {
            db,
            hook,
            prom: a.export_prom.clone(),
        },
    }
}

pub fn run(mut a: LaunchArgs) -> Result<ExitCode> {
    let wanted = match a.hypervisor.as_str() {
        "auto" => None,
        "qemu" => Some(Hypervisor::Qemu),
        "libvirt" => Some(Hypervisor::Libvirt),
        h => {
            return Err(invalid(format!(
                "--hypervisor {h}: expected auto, qemu or libvirt"
            )));
        }
    };
    let resume = a.ckpt.resume_point()?;
    let job_name = match &resume {
        Some(ck) => a.ckpt.job_name(a.job.as_deref(), ck)?,
        None => job_name(a.job.as_deref())?,
    };
    if let Some(ck) = &resume {
        resumed(&mut a, &ck.manifest);
    }
    a.policies = super::site::stacked(&a.policies)?;
    let audit = super::audit::auditor(&a.policies)?;
    // The job's memory on each node is part of the admission: VMs its cgroups cannot hold
    // are refused (and recorded so) before any agent starts.
    let checked = super::launch_admit::admission(&mut a, wanted, resume.as_ref(), &job_name)
        .and_then(|adm| {
            let (cfg, alloc) = agents(&a, adm.grace)?;
            check_job_memory(&alloc.nodes, &adm.sizes)?;
            Ok((adm, cfg, alloc))
        });
    let action = match resume {
        Some(_) => vse_audit::Action::Restore,
        None => vse_audit::Action::Launch,
    };
    let mut entry = vse_audit::Entry::allowed(action)
        .job(job_name.as_str())
        .detail(format!("vse launch -- {}", a.cmd.join(" ")));
    if checked.is_ok() {
        entry.image = vse_audit::image_digest(&a.image);
    }
    let (
        super::launch_admit::Admitted {
            rules,
            shares,
            cwd,
            sizes,
            grace: _,
            hypervisor,
            migration,
            checkpoint,
        },
        cfg,
        alloc,
    ) = super::audit::record(&audit, entry, checked)?;
    let network = (!a.no_network).then(|| {
        rules
            .network
            .as_ref()
            .map_or((JobNet::DEFAULT_BASE, JobNet::DEFAULT_PREFIX), |r| {
                (r.base, r.prefix)
            })
    });
    let hostnames = rules.hostname.as_ref().map(|h| Hostnames {
        pattern: h.value.clone(),
        job: batch_job_id(&job_name),
    });
    let mut monitor = monitor(&a, &job_name, migration);
    if resume.is_some() && a.state_db.is_none() && monitor.control.db.exists() {
        // The job's first launch keeps its database; the resumed one records in its own.
        let own = format!("{job_name}.r{}.state.db", std::process::id());
        monitor.control.db = monitor.control.db.with_file_name(own);
    }
    fresh_job(&monitor.control.db, &job_name)?;
    let shared = nodes_share_machine(&a.allocation);
    let req = LaunchRequest {
        image: std::path::absolute(&a.image)?,
        argv: a.cmd.clone(),
        vms_per_node: a.vms_per_node,
        vcpus: sizes.vcpus,
        memory_mib: sizes.memory_mib,
        vms_per_core: rules.vms_per_core(),
        hypervisor,
        monitor: Some(monitor),
        job_name,
        cpus: node_cpus(&alloc, shared),
        shared_machine: shared,
        stage: StageOptions::default(),
        network: resume.as_ref().map_or(network, |ck| ck.manifest.network),
        mpi: a.mpi,
        spare_nodes: a.spare_nodes,
        hostnames,
        checkpoint,
        restore: resume,
        boot_templates: rules.boot_templates.value && !a.no_template,
        cache: rules.limits.cache(),
        guest_root: a.guest_root,
        stdin: !a.no_stdin,
        shares,
        cwd,
        audit: Some(audit),
    };
    let mut out = Printer::new(a.json);
    let report = launch_blocking(cfg, req, |e| out.on(e))?;
    out.finish(&report)?;
    Ok(ExitCode::from(report.exit_code))
}

/// The job's shares, resolved here as the user, and where its command starts. A resumed
/// job's guests hold the shares they had, by position: the same directories, checked again
/// under today's policies, in the same order (or the restore is refused). Its command line
/// may name its shares again (a requeued batch script runs the same line), but not others.
pub(super) fn job_shares(
    a: &LaunchArgs,
    env: Option<&EffectiveEnv>,
    resumed: Option<&launcher::ckpt::Manifest>,
) -> Result<(Vec<Shared>, Option<String>)> {
    let rules = match env {
        Some(env) => vsec::shares::ShareRules::from_env(env),
        None => super::shares::rules_of(&a.policies)?,
    };
    if let Some(m) = resumed
        && !a.shares.is_empty()
    {
        let spec = env.map(vsec::shares::spec_requests).unwrap_or_default();
        let asked = super::shares::resolve(rules, spec, &a.shares, !a.no_default_shares)?;
        let asked = super::shares::wire(&asked);
        if asked != m.shares {
            return Err(invalid(format!(
                "--share: the checkpoint's guests hold other shares ({}), not these ({}); hint: give the job's own --share options, or none (a restore keeps the checkpoint's)",
                shown(&m.shares),
                shown(&asked)
            )));
        }
        return Ok((asked, m.cwd.clone()));
    }
    if let Some(m) = resumed {
        let args: Vec<String> = m.shares.iter().map(written).collect();
        let again = super::shares::resolve(rules, Vec::new(), &args, false)?;
        let mut again = super::shares::wire(&again);
        // Asked for by name now, so none is a default: each keeps what it was.
        for (s, was) in again.iter_mut().zip(&m.shares) {
            s.optional = was.optional;
        }
        if again != m.shares {
            return Err(invalid(format!(
                "the checkpoint's shares resolve to other directories now ({}, were {}); hint: restore where the same directories are shared",
                shown(&again),
                shown(&m.shares)
            )));
        }
        return Ok((again, m.cwd.clone()));
    }
    let spec = env.map(vsec::shares::spec_requests).unwrap_or_default();
    let shares = super::shares::resolve(rules, spec, &a.shares, !a.no_default_shares)?;
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| super::shares::guest_cwd(&shares, &d));
    Ok((super::shares::wire(&shares), cwd))
}

/// A share as `--share` writes it: `HOST:GUEST[:ro]`.
fn written(s: &Shared) -> String {
    let ro = if s.ro { ":ro" } else { "" };
    format!("{}:{}{ro}", s.host.display(), s.guest)
}

/// Shares as a message lists them, comma-separated.
fn shown(shares: &[Shared]) -> String {
    let all: Vec<String> = shares.iter().map(written).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// A resumed job runs what it ran, with the sizes it had (unless given again).
fn resumed(a: &mut LaunchArgs, m: &launcher::ckpt::Manifest) {
    a.cmd.clone_from(&m.argv);
    a.mpi = m.mpi;
    a.no_network = m.network.is_none();
    a.memory = a.memory.or(Some(m.memory_mib));
    a.vcpus = a.vcpus.or(m.ranks.first().map(|r| r.vcpus));
}

/// What the user sees while the job runs: a spinner with the phase and every rank's output
/// prefixed `[rank N] ` (or, with --json, the output kept for the report).
pub(super) struct Printer {
    bar: Option<indicatif::ProgressBar>,
    prefixers: HashMap<(u32, bool), LinePrefixer>,
    captured: HashMap<(u32, bool), String>,
    json: bool,
}

impl Printer {
    pub(super) fn new(json: bool) -> Self {
        let bar = (!json).then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        let (prefixers, captured) = (HashMap::new(), HashMap::new());
        Self {
            bar,
            prefixers,
            captured,
            json,
        }
    }

    pub(super) fn on(&mut self, e: LaunchEvent) {
        let (rank, stream, text) = match e {
            LaunchEvent::Phase(p) => {
                if let Some(b) = &self.bar {
                    b.set_message(p);
                }
                return;
            }
            LaunchEvent::Output { rank, stream, text } => (rank, stream, text),
        };
        let err = stream == Stream::Stderr;
        if self.json {
            self.captured
                .entry((rank, err))
                .or_default()
                .push_str(&text);
            return;
        }
        let lines = self
            .prefixers
            .entry((rank, err))
            .or_default()
            .push(rank, &text);
        let print = || {
            if err {
                let _ = std::io::stderr().write_all(lines.as_bytes());
            } else {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(lines.as_bytes());
                let _ = o.flush();
            }
        };
        match &self.bar {
            Some(b) => b.suspend(print),
            None => print(),
        }
    }

    pub(super) fn finish(self, report: &LaunchReport) -> Result<()> {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
        print_report(report, self.json, self.prefixers, self.captured)
    }
}

/// The end of the job: the JSON report (with every rank's captured output), or the rest of
/// the prefixed output and what went wrong on stderr.
fn print_report(
    report: &LaunchReport,
    json: bool,
    prefixers: HashMap<(u32, bool), LinePrefixer>,
    mut captured: HashMap<(u32, bool), String>,
) -> Result<()> {
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
        let mut v = serde_json::to_value(report)?;
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
        for c in &report.checkpoints {
            eprintln!(
                "vse launch: checkpoint {} ({}, {}): {} MiB in {} ms, {}",
                c.seq,
                c.reason.as_str(),
                c.cut.describe(),
                c.bytes >> 20,
                c.duration_ms,
                c.path.display()
            );
        }
        for e in report.monitor.iter().flat_map(|m| &m.errors) {
            eprintln!("vse launch: monitoring: {e}");
        }
        if report.exit_code != 0 {
            eprintln!("vse launch: exit {}: {}", report.exit_code, report.reason);
        }
    }
    Ok(())
}
