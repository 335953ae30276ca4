//! A job seen from the front-end's user (the CLI, a test, a benchmark): the events it
//! reports, the orders it takes, and the handles that give them.

use super::{AgentConfig, AgentError, node::run};
use crate::proto::{NodeId, Payload};
use std::{net::SocketAddr, time::Duration};
use tokio::{sync::mpsc, task::JoinHandle};

/// Something the front-end's user (the CLI, a test, a benchmark) should know.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event<A> {
    /// An agent started its child agents.
    Spawned {
        by: NodeId,
        children: Vec<NodeId>,
    },
    /// This node agent has handshaked with its parent: it is up (emitted by node agents only;
    /// the bootstrap benchmarks time each level of the tree by it).
    Linked {
        parent: NodeId,
    },
    /// This node agent's overlay links are up (emitted by node agents only; the front-end
    /// learns of every agent's at [`Event::Ready`]).
    OverlayLinked,
    /// A connection without valid credentials was dropped.
    Rejected {
        peer: SocketAddr,
        reason: String,
    },
    /// The whole tree reported: `up` agents (front-end included) are running.
    Bootstrapped {
        up: usize,
        failed: Vec<NodeId>,
        depth: u32,
        elapsed: Duration,
    },
    /// Every live agent has its overlay links.
    Ready {
        agents: usize,
        elapsed: Duration,
        /// Where every live agent listens (front-end only): what a later front-end needs to
        /// attach to the job.
        directory: Vec<(NodeId, SocketAddr)>,
    },
    /// This node agent lost the front-end and waits up to `grace` for a new one to attach
    /// (emitted by node agents only).
    Orphaned {
        grace: Duration,
    },
    /// A new front-end attached: messages held for it were sent (emitted by node agents only;
    /// `dropped` output messages did not fit the store).
    Adopted {
        dropped: u64,
    },
    NodeFailed {
        node: NodeId,
        by: NodeId,
        reason: String,
    },
    /// An application message routed to this agent.
    Message {
        from: NodeId,
        msg: A,
    },
    /// The answer to a [`Control::Ping`]: `from` is alive and reachable over the overlay.
    Pong {
        from: NodeId,
        seq: u64,
    },
    ShuttingDown {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Failure {
    pub node: NodeId,
    pub by: NodeId,
    pub reason: String,
}

/// How an agent ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exit {
    pub reason: String,
    pub failures: Vec<Failure>,
    /// False when the job ended because of failures.
    pub clean: bool,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.reason)?;
        for x in &self.failures {
            write!(f, "; {} failed ({}, seen by {})", x.node, x.reason, x.by)?;
        }
        Ok(())
    }
}

/// Orders from the front-end's user.
#[derive(Debug, Clone)]
pub enum Control<A> {
    Shutdown {
        reason: String,
    },
    Send {
        dst: NodeId,
        msg: A,
    },
    /// An end-to-end probe over the overlay: answered by [`Event::Pong`].
    Ping {
        dst: NodeId,
        seq: u64,
    },
}

/// A running job seen from the front-end.
pub struct Job<A> {
    ctl: mpsc::UnboundedSender<Control<A>>,
    pub events: mpsc::UnboundedReceiver<Event<A>>,
    task: JoinHandle<Result<Exit, AgentError>>,
}

impl<A: Payload> Job<A> {
    /// Starts the front-end (agent 0), which starts everything else.
    pub fn start(cfg: AgentConfig) -> Self {
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (ev, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(
            AgentConfig {
                id: NodeId(0),
                ..cfg
            },
            None,
            Some(ctl_rx),
            ev,
        ));
        Self { ctl, events, task }
    }

    /// Becomes the front-end (agent 0) of a running job whose front-end was lost: dials the
    /// agents the old one was linked to, as listed in `directory`; the others learn of it
    /// over the overlay. [`Event::Ready`] follows once every live agent routes to it again.
    pub fn attach(cfg: AgentConfig, directory: Vec<(NodeId, SocketAddr)>) -> Self {
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (ev, events) = mpsc::unbounded_channel();
        let cfg = AgentConfig {
            id: NodeId(0),
            ..cfg
        };
        let task = tokio::spawn(super::node::run_attached(cfg, directory, ctl_rx, ev));
        Self { ctl, events, task }
    }

    pub fn control(&self, c: Control<A>) {
        let _ = self.ctl.send(c);
    }

    /// A cloneable handle that can give orders from another thread or task.
    pub fn handle(&self) -> JobHandle<A> {
        JobHandle(self.ctl.clone())
    }

    /// Next event, or None once the front-end has ended.
    pub async fn next_event(&mut self) -> Option<Event<A>> {
        self.events.recv().await
    }

    /// Ends the front-end at once, as if its process were SIGKILLed: nobody is told, its
    /// sockets just close (the simulation's stand-in for a killed `vse launch`).
    pub fn kill(self) {
        self.task.abort();
    }

    pub async fn wait(self) -> Result<Exit, AgentError> {
        self.task
            .await
            .map_err(|e| AgentError::Lost(e.to_string()))?
    }
}

#[derive(Debug)]
pub struct JobHandle<A>(mpsc::UnboundedSender<Control<A>>);

impl<A> Clone for JobHandle<A> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<A> JobHandle<A> {
    pub(crate) fn new(ctl: mpsc::UnboundedSender<Control<A>>) -> Self {
        Self(ctl)
    }

    /// Sends `msg` to agent `dst` over the overlay.
    pub fn send(&self, dst: NodeId, msg: A) {
        self.control(Control::Send { dst, msg });
    }

    pub fn control(&self, c: Control<A>) {
        let _ = self.0.send(c);
    }
}
