//! `vse agent` (hidden): the agent process that `vse launch` starts on every node (directly,
//! with srun, ssh or a wrapper). With `--front-end` it is agent 0 of a bare agent job: it starts
//! the agents over the allocation, prints their events as JSON lines and holds until its stdin
//! closes. That mode runs no user command; it exists to exercise and test the agent layer.

use crate::exit::invalid;
use agents::agent::{Event, OnFailure, Remote, Timing};
use anyhow::{Context, Result};
use clap::Args;
use launcher::job::{JobSetup, NodeSetup, job_config, node_config, run_bare};
use launcher::node::run_node_agent;
use std::{
    io::Write,
    net::{IpAddr, SocketAddr},
    process::ExitCode,
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
    /// How long node agents keep going without a front-end, for a new one to attach.
    #[arg(long, default_value_t = 0)]
    orphan_grace_ms: u64,
    /// How child agents are started: direct, srun, ssh or wrap:CMD (with {host}).
    #[arg(long)]
    remote: Option<String>,
    /// On agent failure: abort (terminate all, exit non-zero) or continue with the survivors.
    #[arg(long, default_value = "abort")]
    on_failure: String,
    /// Front-end listen address (default: loopback when a node is on it, else this machine's
    /// address on the route to the first node).
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
    let setup = NodeSetup {
        id,
        hosts,
        k: a.k,
        timing,
        on_failure,
        remote,
        exe,
        overlay: !a.no_overlay,
        orphan_grace: Duration::from_millis(a.orphan_grace_ms),
    };
    let cfg = node_config(&setup, &mut std::io::stdin().lock())?;
    let verbose = std::env::var_os("VSE_AGENT_LOG").is_some_and(|v| v == "1");
    let exit = run_node_agent(cfg, parent, |e| {
        // The user's terminal gets what went wrong, not routine progress (the front-end
        // reports that); VSE_AGENT_LOG=1 logs every event.
        let noteworthy = matches!(
            e,
            Event::NodeFailed { .. }
                | Event::Rejected { .. }
                | Event::Orphaned { .. }
                | Event::Adopted { .. }
        );
        if noteworthy || verbose {
            eprintln!("agent{id}: {}", json(e));
        }
    })?;
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
    let (cfg, _) = job_config(&JobSetup {
        allocation: &a.allocation,
        listen: a.listen,
        k: a.k,
        timing,
        on_failure,
        remote,
        exe,
        overlay: !a.no_overlay,
        orphan_grace: Duration::from_millis(a.orphan_grace_ms),
    })?;
    let print = |e: &Event<()>| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", json(e));
        let _ = out.flush();
    };
    // Held until whoever started us closes our stdin.
    let exit = run_bare(cfg, print, std::io::stdin())?;
    println!("{}", serde_json::json!({ "event": "exit", "exit": exit }));
    Ok(ExitCode::from(u8::from(!exit.clean)))
}

fn json<A: serde::Serialize>(e: &Event<A>) -> String {
    serde_json::to_string(e)
        .unwrap_or_else(|err| format!("{{\"event\":\"unprintable\",\"error\":\"{err}\"}}"))
}
