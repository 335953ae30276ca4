//! What senders and receivers of an image say on a staging connection (its own authenticated
//! connection per parent-child pair, not the agents' overlay).

use super::chunk::Encoding;
use agents::proto::NodeId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// What staging did on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum StageOutcome {
    /// Received, verified chunk by chunk and as a whole, renamed into the cache.
    Staged,
    /// The cache already held this digest: nothing was sent.
    Cached,
    Failed {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StageMsg {
    /// First frame from a sender: the image, and where every node of the job's tree listens
    /// for it (so a node can take over the children of a dead one).
    Offer {
        digest: String,
        files: Vec<(String, u64)>,
        chunk_size: u64,
        /// Every chunk's SHA-256 (hex), `None` for a hole (all zeros: never sent). The digest
        /// is computed over this table, so the receiver checks it before trusting any entry.
        table: Vec<Option<String>>,
        k: u32,
        nodes: Vec<(NodeId, SocketAddr)>,
    },
    /// Answer to an offer, then every chunk's acknowledgement and the receiver's heartbeat:
    /// chunks `0..next` are on disk and verified; `complete` once the image is in the cache.
    Have { next: u64, complete: bool },
    /// One data chunk of the image, in the frame's blob, encoded as the source chose; it is
    /// checked against the offer's table where it lands. Holes are never sent.
    Chunk {
        digest: String,
        index: u64,
        encoding: Encoding,
    },
    /// A receiver's whole subtree is done: every node staged (or found it cached) or failed.
    Report { nodes: Vec<(NodeId, StageOutcome)> },
}
