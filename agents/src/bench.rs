//! Benchmarks of the real protocol code: agents are tasks with real loopback sockets, in one
//! process, or (`multi`) split across worker processes to stay within the open-file limit.
//! Blocking entry points: each builds its own runtime.

use crate::{
    agent::{
        AgentConfig, AgentError, Control, Event, HostEntry, Job, OnFailure, Timing,
        sim::{Fault, SimSpawner},
    },
    proto::NodeId,
    secret::{JobSecret, SecretError},
    topo::Tree,
};
use serde::Serialize;
use std::{sync::Arc, time::Duration};
use thiserror::Error;

mod host;
pub mod multi;
mod pool;
pub mod worker;

pub use pool::WorkerCommand;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("cannot build the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(
        "{agents} agents need about {need} file descriptors, the limit is {limit}; hint: ulimit -n"
    )]
    FdLimit { agents: u32, need: u64, limit: u64 },
    #[error("benchmark run went wrong: {0}")]
    Run(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct BootstrapFigures {
    pub agents: u32,
    pub k: u32,
    pub depth: u32,
    pub up: usize,
    pub seconds: f64,
    pub seconds_per_level: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetectionFigures {
    pub agents: u32,
    pub fault: String,
    pub heartbeat_ms: u64,
    pub timeout_ms: u64,
    pub latency_ms: Vec<f64>,
}

/// Raises the open-file limit to at least `want` if it can: the soft limit up to the hard one,
/// and the hard one too when the process may (root, CAP_SYS_RESOURCE; bounded by
/// fs.nr_open). Returns the new soft limit.
pub fn raise_fd_limit(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_max < want {
            let up = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            // Fails without the privilege; the soft limit is still raised below.
            libc::setrlimit(libc::RLIMIT_NOFILE, &up);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

pub fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)
}

fn sim_config(
    agents: u32,
    k: u32,
    timing: Timing,
    spawner: Arc<SimSpawner>,
    overlay: bool,
) -> Result<AgentConfig, BenchError> {
    let lo: std::net::IpAddr = "127.0.0.1".parse().expect("literal");
    Ok(AgentConfig {
        id: NodeId(0),
        tree: Tree::new(agents + 1, k),
        secret: JobSecret::generate()?,
        bind: lo,
        hosts: sim_hosts(agents),
        timing,
        on_failure: OnFailure::Continue,
        overlay,
        spawner,
        orphan_grace: Duration::ZERO,
    })
}

/// Simulated agent `i` runs on host `sim{i}`, listening on a loopback address of its own
/// (127.0.0.0/8 is all loopback), as agents on distinct nodes would: with every listener on
/// 127.0.0.1, the kernel's search for a free port crowds one address's bind table and costs
/// more than the protocol.
fn sim_hosts(agents: u32) -> Arc<Vec<HostEntry>> {
    Arc::new(
        (1..=agents)
            .map(|i| HostEntry {
                host: format!("sim{i}"),
                addr: std::net::Ipv4Addr::from(0x7f10_0000 | (i & 0xf_ffff)).into(),
            })
            .collect(),
    )
}

/// Tree bootstrap of `agents` simulated agents with fan-out `k`.
pub fn bootstrap(agents: u32, k: u32) -> Result<BootstrapFigures, BenchError> {
    // listener + both ends of the parent link, per agent, plus slack
    let need = u64::from(agents) * 3 + 256;
    let limit = raise_fd_limit(need);
    if limit < need {
        return Err(BenchError::FdLimit {
            agents,
            need,
            limit,
        });
    }
    let timing = Timing {
        handshake: Duration::from_secs(120),
        ..Timing::default()
    };
    runtime()?.block_on(async {
        let sp = Arc::new(SimSpawner::default());
        let mut job = Job::<()>::start(sim_config(agents, k, timing, sp.clone(), false)?);
        let mut figures = None;
        while let Some(e) = job.next_event().await {
            if let Event::Bootstrapped {
                up,
                depth,
                elapsed,
                failed,
            } = e
            {
                if !failed.is_empty() {
                    return Err(BenchError::Run(format!(
                        "{} agents failed to bootstrap",
                        failed.len()
                    )));
                }
                let s = elapsed.as_secs_f64();
                figures = Some(BootstrapFigures {
                    agents,
                    k,
                    depth,
                    up,
                    seconds: s,
                    seconds_per_level: s / f64::from(depth.max(1)),
                });
            }
        }
        job.wait().await?;
        for _ in 0..600 {
            if sp.alive().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        figures.ok_or_else(|| BenchError::Run("no bootstrap report".into()))
    })
}

/// Time from injecting `fault` into a leaf to the front-end learning of it, `rounds` times.
pub fn detection(
    agents: u32,
    k: u32,
    fault: Fault,
    timing: Timing,
    rounds: u32,
) -> Result<DetectionFigures, BenchError> {
    raise_fd_limit(4096);
    let rt = runtime()?;
    let mut latency_ms = Vec::new();
    for _ in 0..rounds {
        let victim = NodeId(agents);
        // A round that hangs is reported as an error instead of stalling the whole run.
        let limit = timing.handshake * 4 + timing.timeout * 4;
        let ms = rt.block_on(async {
            tokio::time::timeout(limit, async {
                let sp = Arc::new(SimSpawner::with_faults([(victim, fault)]));
                let mut job = Job::<()>::start(sim_config(agents, k, timing, sp.clone(), true)?);
                loop {
                    match job.next_event().await {
                        Some(Event::Ready { .. }) => break,
                        Some(_) => {}
                        None => return Err(BenchError::Run("front-end ended before ready".into())),
                    }
                }
                let t0 = tokio::time::Instant::now();
                sp.trigger(victim);
                let ms = loop {
                    match job.next_event().await {
                        Some(Event::NodeFailed { node, .. }) if node == victim => {
                            break t0.elapsed().as_secs_f64() * 1e3;
                        }
                        Some(_) => {}
                        None => {
                            return Err(BenchError::Run("front-end ended before detection".into()));
                        }
                    }
                };
                job.control(Control::Shutdown {
                    reason: "benchmark done".into(),
                });
                job.wait().await?;
                Ok::<_, BenchError>(ms)
            })
            .await
            .map_err(|_| {
                BenchError::Run(format!("a detection round did not finish within {limit:?}"))
            })?
        })?;
        latency_ms.push(ms);
    }
    Ok(DetectionFigures {
        agents,
        fault: format!("{fault:?}"),
        heartbeat_ms: timing.heartbeat.as_millis() as u64,
        timeout_ms: timing.timeout.as_millis() as u64,
        latency_ms,
    })
}
