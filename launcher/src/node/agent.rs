//! A node agent process: the agent runtime with a [`NodeService`] acting on its events.

use super::NodeService;
use crate::wire::Wire;
use agents::agent::{AgentConfig, AgentError, Event, Exit, run_node_blocking};
use std::net::SocketAddr;

/// Runs this node's agent until the job ends, handing every event to `log` before the node
/// acts on it. Whatever ended the agent, no VM it started outlives it.
pub fn run_node_agent(
    cfg: AgentConfig,
    parent: SocketAddr,
    mut log: impl FnMut(&Event<Wire>) + Send,
) -> Result<Exit, AgentError> {
    // A batch system ending the job signals every process of it at once; the node agent must
    // stay for the front-end's checkpoint (its VMs pause on the same signal). It still ends
    // with the front-end, which it watches, and with the batch system's SIGKILL.
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    let mut service = NodeService::new(cfg.id, cfg.bind, cfg.secret.clone());
    let exit = run_node_blocking(cfg, parent, |e, h| {
        log(e);
        service.on_event(e, h);
    });
    service.teardown();
    exit
}
