//! Messages between agents: the runtime's own (bootstrap, overlay, heartbeat, failures,
//! routing, shutdown) and an application's, carried as the payload `A`.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::net::SocketAddr;

/// Position of an agent in the job: 0 is the front-end, 1..=N the node agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "agent{}", self.0)
    }
}

/// What an application's messages must be to travel between agents.
pub trait Payload:
    Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Orders only the front-end may give: an agent drops one that comes from anyone else.
    fn front_end_only(&self) -> bool {
        false
    }

    /// What a node agent without a front-end does with this message to the front-end while
    /// it waits for a new one to attach.
    fn held(&self) -> Held {
        Held::Keep
    }
}

/// How a message to a lost front-end is held until a new one attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Always delivered (statuses, the protocol's answers).
    Keep,
    /// Delivered while the agent's bounded store has room (output), else counted and dropped.
    Bounded,
    /// Only meaningful to the front-end that asked (samples): dropped.
    Drop,
}

/// A job of bare agents (the runtime's tests and benchmarks) says nothing of its own.
impl Payload for () {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg<A> {
    /// First frame on a connection: who is calling and where it listens.
    Hello {
        id: NodeId,
        listen: SocketAddr,
    },
    /// Answer to Hello: the callee's identity.
    Welcome {
        id: NodeId,
    },
    /// Child to parent once its own subtree has bootstrapped (or failed to).
    SubtreeReady {
        up: Vec<(NodeId, SocketAddr)>,
        failed: Vec<NodeId>,
    },
    /// Front-end down the tree, each parent passing on what its child's subtree needs: the
    /// addresses of the live agents that subtree links to in the overlay (not every agent's:
    /// that would make the directories' total size grow with N²), and every agent that did
    /// not come up.
    Directory {
        addrs: Vec<(NodeId, SocketAddr)>,
        dead: Vec<NodeId>,
    },
    /// An agent's overlay links are up.
    OverlayReady {
        id: NodeId,
    },
    Ping {
        seq: u64,
    },
    Pong {
        seq: u64,
    },
    /// Flooded over the overlay: `node` is dead, as seen by `by`.
    Failed {
        node: NodeId,
        by: NodeId,
        reason: String,
    },
    /// Unicast over the overlay's routing tables.
    Routed {
        src: NodeId,
        dst: NodeId,
        hops: u8,
        inner: Box<Msg<A>>,
    },
    /// Flooded: a new front-end attached to the job (agents that had lost the old one
    /// route to it again).
    Attached,
    /// Flooded: terminate everything and exit.
    Shutdown {
        reason: String,
    },
    /// The application's own message.
    App(A),
}
