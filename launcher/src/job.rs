//! How the agents of a job are configured: the front-end's from the allocation
//! ([`job_config`]), a node agent's from what its parent passed it ([`node_config`]), and the
//! bare agent job ([`run_bare`]) that exercises the agent layer without running a command.

use agents::agent::{
    AgentConfig, AgentError, Control, Event, Exit, HostsError, Job, OnFailure, ProcessSpawner,
    Remote, Timing, parse_hosts, run_blocking,
};
use agents::alloc::{AllocError, Allocation, AllocationSource, Launcher};
use agents::proto::NodeId;
use agents::secret::{JobSecret, SecretError};
use agents::{agent::HostEntry, topo::Tree};
use std::io::{BufRead, Read};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vse_exit::{Classify, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    NoRoute(#[from] agents::alloc::NoRoute),
    #[error(
        "{0}: a wildcard address would listen on every interface of the machine; hint: give this node's address on the allocation network (--listen IP, or the host entry's address)"
    )]
    Wildcard(IpAddr),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("reading the job secret from stdin: {0}")]
    ReadSecret(#[source] std::io::Error),
    #[error("job secret on stdin: {0}")]
    BadSecret(#[source] SecretError),
    #[error("--hosts: {0}")]
    Hosts(#[source] HostsError),
    #[error("--id {id} is not in 1..={nodes}")]
    BadId { id: u32, nodes: usize },
    #[error(transparent)]
    Agent(#[from] AgentError),
}

/// Wrong arguments are the caller's; a host without randomness or I/O is internal.
impl Classify for JobError {
    fn kind(&self) -> ErrorKind {
        match self {
            JobError::Alloc(e) => e.kind(),
            JobError::Hosts(e) => e.kind(),
            JobError::NoRoute(e) => e.kind(),
            JobError::Wildcard(_) | JobError::BadId { .. } => ErrorKind::InvalidInput,
            JobError::Secret(_)
            | JobError::ReadSecret(_)
            | JobError::BadSecret(_)
            | JobError::Agent(_) => ErrorKind::Internal,
        }
    }
}

/// What the front-end of a job (`vse agent --front-end`, `vse launch`) is started with.
pub struct JobSetup<'a> {
    pub allocation: &'a str,
    /// The front-end's address; `None`: loopback when a node is on it, else this machine's
    /// source address on the route to the first node.
    pub listen: Option<IpAddr>,
    pub k: u32,
    pub timing: Timing,
    pub on_failure: OnFailure,
    pub remote: Option<Remote>,
    pub exe: PathBuf,
    pub overlay: bool,
    /// How long node agents keep the job going without a front-end (for `vse attach`).
    pub orphan_grace: Duration,
}

/// The front-end's agent configuration for the allocation named by `allocation`, with a new
/// job secret.
pub fn job_config(s: &JobSetup) -> Result<(AgentConfig, Allocation), JobError> {
    let source: AllocationSource = s.allocation.parse()?;
    let env = std::env::vars().collect();
    let alloc = Allocation::detect(&source, &env)?;
    let hosts = (alloc.nodes.iter())
        .map(|n| {
            let (host, addr) = (n.host.clone(), n.resolve()?);
            Ok(HostEntry { host, addr })
        })
        .collect::<Result<Vec<_>, AllocError>>()?;
    let listen = match (s.listen, hosts.first()) {
        (Some(l), _) => l,
        (None, _) if hosts.iter().any(|h| h.addr.is_loopback()) => [127, 0, 0, 1].into(),
        // The address this machine reaches the nodes from: on the nodes' network.
        (None, Some(first)) => agents::alloc::source_address_to(first.addr)?,
        (None, None) => [127, 0, 0, 1].into(),
    };
    no_wildcard(listen)?;
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
        orphan_grace: s.orphan_grace,
    };
    Ok((cfg, alloc))
}

/// Every listener of a job (agents, staging, migration, the switch, relays) binds the agent's
/// address: it must name one interface.
fn no_wildcard(ip: IpAddr) -> Result<(), JobError> {
    if ip.is_unspecified() {
        return Err(JobError::Wildcard(ip));
    }
    Ok(())
}

/// What a node agent is started with by its parent.
pub struct NodeSetup<'a> {
    pub id: u32,
    /// Every node as `HOST@ADDR,...`; node `id` binds the address of entry `id`.
    pub hosts: &'a str,
    pub k: u32,
    pub timing: Timing,
    pub on_failure: OnFailure,
    /// How this agent starts its own children.
    pub remote: Remote,
    pub exe: PathBuf,
    pub overlay: bool,
    pub orphan_grace: Duration,
}

/// A node agent's configuration; the job secret is the first line of `secret` (the parent
/// writes it to the child's stdin, never to its command line).
pub fn node_config(s: &NodeSetup, secret: &mut dyn BufRead) -> Result<AgentConfig, JobError> {
    let hosts = parse_hosts(s.hosts).map_err(JobError::Hosts)?;
    let mut line = String::new();
    secret.read_line(&mut line).map_err(JobError::ReadSecret)?;
    let secret = JobSecret::from_transport(&line).map_err(JobError::BadSecret)?;
    let bind = (hosts.get((s.id as usize).wrapping_sub(1)))
        .map(|h| h.addr)
        .ok_or(JobError::BadId {
            id: s.id,
            nodes: hosts.len(),
        })?;
    no_wildcard(bind)?;
    Ok(AgentConfig {
        id: NodeId(s.id),
        tree: Tree::new(hosts.len() as u32 + 1, s.k),
        secret,
        bind,
        hosts: Arc::new(hosts),
        timing: s.timing,
        on_failure: s.on_failure,
        overlay: s.overlay,
        spawner: Arc::new(ProcessSpawner {
            exe: s.exe.clone(),
            remote: s.remote.clone(),
        }),
        orphan_grace: s.orphan_grace,
    })
}

/// The bare agent job: agent 0 starts the agents, hands every event to `on_event` and holds
/// the job until `hold` reaches its end (whoever started it closes its stdin).
pub fn run_bare(
    cfg: AgentConfig,
    on_event: impl FnMut(&Event<()>),
    hold: impl Read + Send + 'static,
) -> Result<Exit, JobError> {
    let mut hold = Some(hold);
    let ready = |job: &Job<()>| {
        let Some(mut hold) = hold.take() else {
            return;
        };
        let h = job.handle();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut hold, &mut std::io::sink());
            h.control(Control::Shutdown {
                reason: "stdin closed".into(),
            });
        });
    };
    Ok(run_blocking(cfg, None, on_event, ready)?)
}
