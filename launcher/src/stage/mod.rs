//! Image staging (seed 003 §3): the image directory travels from the front-end down the job's
//! k-ary tree to a node-local cache on every node. It is pipelined in chunks (a node forwards
//! chunk i to its children as soon as it has verified it), checked by SHA-256 per chunk and as a
//! whole, written under a temporary name and renamed only when complete. A node asked first
//! whether it already holds the digest is skipped. When a node dies mid-transfer its sender
//! reports it and adopts its children: the nearest live ancestor resends, resuming each child
//! from the chunks it already has.

#[cfg(feature = "bench")]
mod bench;
mod cache;
mod chunk;
mod layout;
mod node;
mod send;
mod store;
pub mod wire;

#[cfg(feature = "bench")]
pub use bench::{DirStaging, LevelFigures, StagingFigures, stage_dir, staging, zstd_levels};
pub use cache::{UnsafeCache, prepare as prepare_cache};
pub use chunk::Encoding;
pub use layout::{ChunkHash, DEFAULT_CHUNK, Layout, check_name};
pub use node::{StageEvent, StageServer};
pub use send::{StageSummary, stage_image};
pub use wire::StageOutcome;

use std::{path::PathBuf, time::Duration};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StageError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("not a stageable image: {0}")]
    BadImage(String),
    #[error("invalid staging offer: {0}")]
    BadOffer(String),
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error(transparent)]
    UnsafeCache(#[from] UnsafeCache),
    #[error("cannot listen for staging on {addr}: {source}")]
    Listen {
        addr: std::net::IpAddr,
        source: std::io::Error,
    },
}

/// Knobs shared by senders and receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageOptions {
    pub chunk_size: u64,
    /// Chunks a sender may have in flight before the first is acknowledged.
    pub window: u64,
    /// Connect + offer/answer deadline.
    pub handshake: Duration,
    /// Receivers report progress at least this often, even when idle.
    pub heartbeat: Duration,
    /// A receiver silent this long is declared failed and its children adopted.
    pub timeout: Duration,
    /// Per-link rate cap in bytes/s (None: as fast as the link goes). Lets a test or a shared
    /// cluster keep staging from saturating the network.
    pub rate: Option<u64>,
    /// zstd level for chunks on the wire (None: raw). Chosen by measurement: see
    /// [`DEFAULT_ZSTD_LEVEL`].
    pub compress: Option<i32>,
}

/// zstd level of staged chunks. Measured on a 2-core machine over the minimal image's data
/// chunks: level 1 compresses to about a third at several hundred MB/s; higher levels gain a
/// few percent for several times the source's CPU (`vse bench stage --levels`).
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK,
            window: 8,
            handshake: Duration::from_secs(10),
            heartbeat: Duration::from_millis(500),
            timeout: Duration::from_secs(5),
            rate: None,
            compress: Some(DEFAULT_ZSTD_LEVEL),
        }
    }
}
