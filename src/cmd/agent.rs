//! `vse agent` (hidden): the agent process that `vse launch` starts on every node (directly,
//! with srun, ssh or a wrapper). With `--front-end` it is agent 0 of a bare agent job: it starts
//! the agents over the allocation, prints their events as JSON lines and holds until its stdin
//! closes. That mode runs no user command; it exists to exercise and test the agent layer.

use crate::exit::{Failure, invalid};
use agents::{
    agent::{
        AgentConfig, Control, Event, HostEntry, OnFailure, ProcessSpawner, Remote, Timing,
        parse_hosts, run_blocking, run_node_blocking,
    },
    alloc::{Allocation, AllocationSource, Launcher},
    proto::NodeId,
    secret::JobSecret,
    topo::Tree,
};
use anyhow::{Context, Result};
use clap::Args;
use std::{
    io::{BufRead, Write},
    net::{IpAddr, SocketAddr},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Be agent 0: start agents over --allocation and report (runs no command).
    #[arg(long)]
    front_end: bool,
    /// Where the nodes come from (front-end): slurm, pbs, hostfile:FILE or local[:N].
    #[arg(long, default_value = "local:2")]
    allocation: String,
    /// This agent's id (node agents).
    #[arg(long)]
    id: Option<u32>,
    /// The parent's address to handshake with (node agents).
    #[arg(long)]
    parent: Option<SocketAddr>,
    /// Fan-out of the bootstrap tree.
    #[arg(long, default_value_t = 2)]
    k: u32,
    /// All nodes as HOST@ADDR,... (node agents; the front-end derives it from --allocation).
    #[arg(long)]
    hosts: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    handshake_ms: u64,
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 3_000)]
    timeout_ms: u64,
    #[arg(long)]
    no_overlay: bool,
    /// How child agents are started: direct, srun, ssh or wrap:CMD (with {host}).
    #[arg(long)]
    remote: Option<String>,
    /// On agent failure: abort (terminate all, exit non-zero) or continue with the survivors.
    #[arg(long, default_value = "abort")]
    on_failure: String,
    /// Front-end listen address (default: loopback for local allocations).
    #[arg(long)]
    listen: Option<IpAddr>,
}

pub fn run(a: AgentArgs) -> Result<ExitCode> {
    let timing = Timing {
        handshake: Duration::from_millis(a.handshake_ms),
        heartbeat: Duration::from_millis(a.heartbeat_ms),
        timeout: Duration::from_millis(a.timeout_ms),
    };
    if a.heartbeat_ms == 0 || a.timeout_ms <= a.heartbeat_ms {
        return Err(invalid(
            "--timeout-ms must exceed --heartbeat-ms, which must be > 0",
        ));
    }
    let on_failure = match a.on_failure.as_str() {
        "abort" => OnFailure::Abort,
        "continue" => OnFailure::Continue,
        o => {
            return Err(invalid(format!(
                "--on-failure {o}: expected abort or continue"
            )));
        }
    };
    let remote: Option<Remote> = a.remote.as_deref().map(str::parse).transpose()?;
    let exe = std::env::current_exe().context("cannot find the vse executable")?;
    if a.front_end {
        front_end(&a, timing, on_failure, remote, exe)
    } else {
        node_agent(
            &a,
            timing,
            on_failure,
            remote.unwrap_or(Remote::Direct),
            exe,
        )
    }
}

fn node_agent(
    a: &AgentArgs,
    timing: Timing,
    on_failure: OnFailure,
    remote: Remote,
    exe: std::path::PathBuf,
) -> Result<ExitCode> {
    let (Some(id), Some(parent), Some(hosts)) = (a.id, a.parent, a.hosts.as_deref()) else {
        return Err(invalid("a node agent needs --id, --parent and --hosts"));
    };
    let hosts = parse_hosts(hosts).map_err(|e| Failure::reword(&e, format!("--hosts: {e}")))?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the job secret from stdin")?;
    let secret = JobSecret::from_hex(&line).context("job secret on stdin")?;
    let bind = hosts
        .get((id as usize).wrapping_sub(1))
        .map(|h| h.addr)
        .ok_or_else(|| invalid(format!("--id {id} is not in 1..={}", hosts.len())))?;
    let cfg = AgentConfig {
        id: NodeId(id),
        tree: Tree::new(hosts.len() as u32 + 1, a.k),
        secret,
        bind,
        hosts: Arc::new(hosts),
        timing,
        on_failure,
        overlay: !a.no_overlay,
        spawner: Arc::new(ProcessSpawner { exe, remote }),
    };
    // The root/session/tool roles of `vse launch` act on the front-end's orders.
    let verbose = std::env::var_os("VSE_AGENT_LOG").is_some_and(|v| v == "1");
    let mut service = super::launch::node::NodeService::new(cfg.id, bind, cfg.secret.clone());
    let exit = run_node_blocking(cfg, parent, |e, h| {
        // The user's terminal gets what went wrong, not routine progress (the front-end
        // reports that); VSE_AGENT_LOG=1 logs every event.
        let noteworthy = matches!(e, Event::NodeFailed { .. } | Event::Rejected { .. });
        if noteworthy || verbose {
            eprintln!("agent{id}: {}", json(e));
        }
        service.on_event(e, h);
    });
    // Whatever ended the agent, no VM it started outlives it.
    service.teardown();
    let exit = exit?;
    if !exit.clean || verbose {
        eprintln!("agent{id}: exit: {exit}");
    }
    Ok(ExitCode::from(u8::from(!exit.clean)))
}

fn front_end(
    a: &AgentArgs,
    timing: Timing,
    on_failure: OnFailure,
    remote: Option<Remote>,
    exe: std::path::PathBuf,
) -> Result<ExitCode> {
    let cfg = job_config(&JobSetup {
        allocation: &a.allocation,
        listen: a.listen,
        k: a.k,
        timing,
        on_failure,
        remote,
        exe,
        overlay: !a.no_overlay,
    })?
    .0;
    let print = |e: &Event<()>| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", json(e));
        let _ = out.flush();
    };
    let hold = |job: &agents::agent::Job<()>| {
        let h = job.handle();
        std::thread::spawn(move || {
            // Hold the job until whoever started us closes our stdin.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            h.control(Control::Shutdown {
                reason: "stdin closed".into(),
            });
        });
    };
    let exit = run_blocking(cfg, None, print, hold)?;
    println!("{}", serde_json::json!({ "event": "exit", "exit": exit }));
    Ok(ExitCode::from(u8::from(!exit.clean)))
}

fn json<A: serde::Serialize>(e: &Event<A>) -> String {
    serde_json::to_string(e)
        .unwrap_or_else(|err| format!("{{\"event\":\"unprintable\",\"error\":\"{err}\"}}"))
}

/// What the front-end of a job (`vse agent --front-end`, `vse launch`) is started with.
pub(crate) struct JobSetup<'a> {
    pub allocation: &'a str,
    pub listen: Option<IpAddr>,
    pub k: u32,
    pub timing: Timing,
    pub on_failure: OnFailure,
    pub remote: Option<Remote>,
    pub exe: std::path::PathBuf,
    pub overlay: bool,
}

/// The front-end's agent configuration for the allocation named by `--allocation`.
pub(crate) fn job_config(s: &JobSetup) -> Result<(AgentConfig, Allocation)> {
    let source: AllocationSource = s.allocation.parse()?;
    let env = std::env::vars().collect();
    let alloc = Allocation::detect(&source, &env)?;
    let hosts = alloc
        .nodes
        .iter()
        .map(|n| {
            Ok(HostEntry {
                host: n.host.clone(),
                addr: n.resolve()?,
            })
        })
        .collect::<Result<Vec<_>, agents::alloc::AllocError>>()?;
    let listen = match s.listen {
        Some(l) => l,
        None if hosts.iter().any(|h| h.addr.is_loopback()) => [127, 0, 0, 1].into(),
        None => {
            return Err(invalid(
                "--listen IP is needed: no node is on this machine's loopback",
            ));
        }
    };
    let remote = s.remote.clone().unwrap_or(match alloc.launcher {
        Launcher::Srun => Remote::Srun,
        Launcher::Ssh => Remote::Ssh,
        Launcher::Local => Remote::Direct,
    });
    let cfg = AgentConfig {
        id: NodeId(0),
        tree: Tree::new(hosts.len() as u32 + 1, s.k),
        secret: JobSecret::generate()?,
        bind: listen,
        hosts: Arc::new(hosts),
        timing: s.timing,
        on_failure: s.on_failure,
        overlay: s.overlay,
        spawner: Arc::new(ProcessSpawner {
            exe: s.exe.clone(),
            remote,
        }),
    };
    Ok((cfg, alloc))
}
