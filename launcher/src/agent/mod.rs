//! The agent runtime: one process (or task) per node, with the roles of [`role`]; agent 0 is
//! the front-end. Bootstrap follows the k-ary tree, then agents link up along the BMG overlay
//! and watch each other (connection closed, heartbeat, child exit).

mod config;
mod links;
mod node;
pub mod role;
mod spawn;

pub use config::{AgentConfig, HostEntry, OnFailure, Timing, parse_hosts};
pub use node::{Control, Event, Exit, Failure, Job};
pub use spawn::{
    ChildSpec, InProcess, ProcessSpawner, Remote, SharedSpawner, SpawnError, SpawnedChild, Spawner,
    run_child,
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::IpAddr,
        source: std::io::Error,
    },
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    #[error("agent id {id} is outside the job (size {size})")]
    BadId { id: u32, size: u32 },
    #[error("the front-end task panicked or was cancelled: {0}")]
    Lost(String),
}

/// Runs one node agent until the job ends (what `vse agent` does in each process).
pub async fn run_node_agent(
    cfg: AgentConfig,
    parent: std::net::SocketAddr,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
) -> Result<Exit, AgentError> {
    if cfg.id.0 == 0 || cfg.id.0 >= cfg.tree.size() {
        return Err(AgentError::BadId {
            id: cfg.id.0,
            size: cfg.tree.size(),
        });
    }
    node::run(cfg, Some(parent), None, events).await
}
