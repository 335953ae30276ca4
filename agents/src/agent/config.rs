//! What every agent of a job knows before it starts.

use super::spawn::SharedSpawner;
use crate::{proto::NodeId, secret::JobSecret, topo::Tree};
use std::{net::IpAddr, net::SocketAddr, sync::Arc, time::Duration};

/// A node: its name (for srun/ssh) and the address its agent listens on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostEntry {
    pub host: String,
    pub addr: IpAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A child must complete its handshake this long after being started.
    pub handshake: Duration,
    /// Heartbeat ping period on every link.
    pub heartbeat: Duration,
    /// A link silent for this long is declared failed.
    pub timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            heartbeat: Duration::from_millis(500),
            timeout: Duration::from_secs(3),
        }
    }
}

/// The user's choice when agents fail (at bootstrap or later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Terminate everything cleanly and report (the default).
    #[default]
    Abort,
    /// Go on with the survivors.
    Continue,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub id: NodeId,
    pub tree: Tree,
    pub secret: JobSecret,
    /// Address this agent listens on: the allocation's own network, never 0.0.0.0.
    pub bind: IpAddr,
    /// `hosts[i - 1]` is where agent `i` runs.
    pub hosts: Arc<Vec<HostEntry>>,
    pub timing: Timing,
    pub on_failure: OnFailure,
    /// Build the BMG overlay after bootstrap (off: the front-end stops right after bootstrap,
    /// which is what the bootstrap benchmark measures).
    pub overlay: bool,
    pub spawner: SharedSpawner,
    /// How long a node agent that lost the front-end keeps going (its VMs running, its
    /// messages to the front-end held) for a new front-end to attach; zero: it ends at once.
    pub orphan_grace: Duration,
}

impl AgentConfig {
    pub fn host_of(&self, id: NodeId) -> Option<String> {
        let i = (id.0 as usize).checked_sub(1)?;
        self.hosts.get(i).map(|h| h.host.clone())
    }

    /// The configuration agent `id` runs with.
    pub fn for_child(&self, id: NodeId) -> Self {
        let bind = (id.0 as usize)
            .checked_sub(1)
            .and_then(|i| self.hosts.get(i))
            .map_or(self.bind, |h| h.addr);
        Self {
            id,
            bind,
            ..self.clone()
        }
    }

    /// `agent …` arguments for a `vse agent` process (the secret travels separately).
    pub fn to_args(&self, id: NodeId, parent: SocketAddr) -> Vec<String> {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("{}@{}", h.host, h.addr))
            .collect();
        let ms = |d: Duration| d.as_millis().to_string();
        let mut a: Vec<String> = vec![
            "agent".into(),
            "--id".into(),
            id.0.to_string(),
            "--parent".into(),
            parent.to_string(),
            "--k".into(),
            self.tree.k().to_string(),
            "--hosts".into(),
            hosts.join(","),
            "--handshake-ms".into(),
            ms(self.timing.handshake),
            "--heartbeat-ms".into(),
            ms(self.timing.heartbeat),
            "--timeout-ms".into(),
            ms(self.timing.timeout),
        ];
        if !self.overlay {
            a.push("--no-overlay".into());
        }
        if !self.orphan_grace.is_zero() {
            a.extend(["--orphan-grace-ms".into(), ms(self.orphan_grace)]);
        }
        a.extend(self.spawner.child_args());
        a
    }
}

/// A bad entry of `--hosts`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostsError {
    #[error("`{0}`: expected HOST@ADDRESS")]
    NoAddress(String),
    #[error("`{item}`: bad address: {source}")]
    BadAddress {
        item: String,
        source: std::net::AddrParseError,
    },
}

impl vse_exit::Classify for HostsError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// Parses `host@addr,host@addr` (the `--hosts` of `vse agent`).
pub fn parse_hosts(s: &str) -> Result<Vec<HostEntry>, HostsError> {
    s.split(',')
        .map(|item| {
            let (host, addr) = item
                .split_once('@')
                .ok_or_else(|| HostsError::NoAddress(item.to_string()))?;
            let addr = addr.parse().map_err(|source| HostsError::BadAddress {
                item: item.to_string(),
                source,
            })?;
            Ok(HostEntry {
                host: host.to_string(),
                addr,
            })
        })
        .collect()
}
