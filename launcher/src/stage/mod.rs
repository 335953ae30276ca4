//! Image staging (seed 003 §3): the image directory travels from the front-end down the job's
//! k-ary tree to a node-local cache on every node. Only data travels and lands: the front-end
//! reads the image once (holes found with SEEK_DATA, all-zero chunks counted as holes), hashes
//! each data chunk once and offers the chunk table, whose hash is the image digest; chunks go
//! out compressed with zstd when that pays, and are written at their offsets into files that
//! start as one hole, so every copy is sparse. A node verifies each chunk once (what it
//! decodes to against the table) and relays it to its children as it came, while it writes it
//! (cut-through), with one fsync per file once the image is complete; the image is renamed
//! into place only then. A node asked first whether it already holds the digest is skipped.
//! A link that breaks mid-image (a frame damaged on the way fails its authentication) is
//! dialled again and the child resumes from the chunks it verified, so damaged data is fetched
//! again. When a node dies mid-transfer its sender reports it and adopts its children: the
//! nearest live ancestor resends, resuming each child from the chunks it already has.

#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "bench")]
mod bench_procs;
mod cache;
mod chunk;
mod layout;
mod node;
mod send;
mod stamp;
mod store;
pub mod wire;

#[cfg(feature = "bench")]
pub use bench::{
    DirStaging, LevelFigures, StagingFigures, stage_dir, staging, write_noise, zstd_levels,
};
#[cfg(feature = "bench")]
pub use bench_procs::{serve_node, stage_dir_processes};
pub use cache::{UnsafeCache, keep_within as keep_cache_within, prepare as prepare_cache};
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

/// zstd level of staged chunks, by measurement (`vse bench stage`, over the minimal image's
/// 313 MiB of data chunks, one core of the 2-core development machine): level 1 sends 107 MiB
/// and encodes at ~420 MB/s; level 3 sends 7% less at ~270 MB/s, level 6 11% less at ~110 MB/s.
/// Decoding runs at ~800 MB/s whatever the level, and the source encodes every chunk, so
/// level 1 keeps the source ahead of the tree.
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
