//! An authenticated connection. Both ends send a fresh 16-byte nonce first; every frame one end
//! sends is MACed over the *other* end's nonce and its direction, with sequence numbers counting
//! up from 0, so a frame recorded on one connection is worthless on any other, cannot be
//! replayed on its own, and cannot be reflected back to the end that sent it. A peer that
//! answers with our own nonce is refused outright.

use super::{Direction, MAX_FRAME, ProtoError, decode_frame, encode_frame};
use crate::secret::{JobSecret, nonce};
use serde::{Serialize, de::DeserializeOwned};
use std::time::Duration;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
};

pub struct LinkTx {
    w: OwnedWriteHalf,
    key: JobSecret,
    peer_nonce: [u8; 16],
    dir: Direction,
    seq: u64,
}

pub struct LinkRx {
    r: OwnedReadHalf,
    key: JobSecret,
    my_nonce: [u8; 16],
    dir: Direction,
    next: u64,
}

impl LinkTx {
    pub async fn send<M: Serialize>(&mut self, msg: &M) -> Result<(), ProtoError> {
        self.send_blob(msg, &[]).await
    }

    pub async fn send_blob<M: Serialize>(
        &mut self,
        msg: &M,
        blob: &[u8],
    ) -> Result<(), ProtoError> {
        let frame = encode_frame(&self.key, &self.peer_nonce, self.dir, self.seq, msg, blob)?;
        self.seq += 1;
        self.w.write_all(&frame).await?;
        Ok(())
    }
}

impl LinkRx {
    /// Next authenticated message. Any error means the link must be dropped: after a bad frame
    /// the stream position can no longer be trusted.
    pub async fn recv<M: DeserializeOwned>(&mut self) -> Result<(M, Vec<u8>), ProtoError> {
        let mut len = [0u8; 4];
        match self.r.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ProtoError::Closed);
            }
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(ProtoError::TooLarge(len));
        }
        let mut body = vec![0u8; len];
        self.r
            .read_exact(&mut body)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => ProtoError::Closed,
                _ => e.into(),
            })?;
        let (seq, msg, blob) = decode_frame(&self.key, &self.my_nonce, self.dir, &body)?;
        if seq != self.next {
            return Err(ProtoError::Replay {
                expected: self.next,
                got: seq,
            });
        }
        self.next += 1;
        Ok((msg, blob))
    }
}

/// `sends`: the direction of this end's frames.
async fn exchange(
    stream: TcpStream,
    key: &JobSecret,
    deadline: Duration,
    sends: Direction,
) -> Result<(LinkTx, LinkRx), ProtoError> {
    stream.set_nodelay(true)?;
    let mine = nonce().map_err(|e| ProtoError::Malformed(e.to_string()))?;
    let (mut r, mut w) = stream.into_split();
    let peer = tokio::time::timeout(deadline, async {
        w.write_all(&mine).await?;
        let mut peer = [0u8; 16];
        r.read_exact(&mut peer).await?;
        Ok::<_, std::io::Error>(peer)
    })
    .await
    .map_err(|_| ProtoError::Timeout)?
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => ProtoError::Closed,
        _ => e.into(),
    })?;
    if peer == mine {
        return Err(ProtoError::EchoedNonce);
    }
    Ok((
        LinkTx {
            w,
            key: key.clone(),
            peer_nonce: peer,
            dir: sends,
            seq: 0,
        },
        LinkRx {
            r,
            key: key.clone(),
            my_nonce: mine,
            dir: sends.reverse(),
            next: 0,
        },
    ))
}

/// Caller side: sends `hello`, expects an authenticated answer within `deadline`.
pub async fn connect<M: Serialize + DeserializeOwned>(
    stream: TcpStream,
    key: &JobSecret,
    hello: &M,
    deadline: Duration,
) -> Result<(LinkTx, LinkRx, M), ProtoError> {
    let (mut tx, mut rx) = exchange(stream, key, deadline, Direction::ToAcceptor).await?;
    let answer = tokio::time::timeout(deadline, async {
        tx.send(hello).await?;
        rx.recv().await
    })
    .await
    .map_err(|_| ProtoError::Timeout)??;
    Ok((tx, rx, answer.0))
}

/// Callee side: returns the peer's authenticated first message; the caller answers it.
pub async fn accept<M: DeserializeOwned>(
    stream: TcpStream,
    key: &JobSecret,
    deadline: Duration,
) -> Result<(LinkTx, LinkRx, M), ProtoError> {
    let (tx, mut rx) = exchange(stream, key, deadline, Direction::ToDialer).await?;
    let first = tokio::time::timeout(deadline, rx.recv())
        .await
        .map_err(|_| ProtoError::Timeout)??;
    Ok((tx, rx, first.0))
}
