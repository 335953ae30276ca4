//! The control wire protocol: length-prefixed frames, each authenticated with HMAC-SHA256 under
//! the per-job secret, bound to a per-connection challenge and a strictly increasing sequence
//! number (so tampered, foreign and replayed frames are all rejected).

mod frame;
mod gate;
mod link;
mod msg;

pub use frame::{Direction, MAX_BLOB, MAX_FRAME, decode_frame, encode_frame};
pub use gate::{Gate, MAX_UNAUTHENTICATED};
pub use link::{LinkRx, LinkTx, accept, connect};
pub use msg::{Held, Msg, NodeId, Payload};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProtoError {
    #[error("connection closed by peer")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("frame malformed: {0}")]
    Malformed(String),
    #[error("authentication failed: bad HMAC (wrong job secret or tampered frame)")]
    BadMac,
    #[error("replayed or reordered frame: expected sequence {expected}, got {got}")]
    Replay { expected: u64, got: u64 },
    #[error("the peer answered with our own connection nonce (a reflected handshake)")]
    EchoedNonce,
    #[error("handshake did not finish within the deadline")]
    Timeout,
}
