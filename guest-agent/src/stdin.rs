//! A running command's standard input, streamed by the host (`Request::Stdin`): each chunk
//! names its offset in the input, so a chunk sent again (after the host end moved) is written
//! once, and each is acknowledged once written, so the host never has more than it waits for
//! in flight and a command that stops reading holds back the host, not the guest's memory.
//! Chunks travel on the request loop; the writing happens on a thread of the command's own.

use crate::protocol::Message;
use crate::sync::lock;
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};

/// One `Request::Stdin`.
#[derive(Debug)]
pub struct Chunk {
    /// The request's id, for its reply.
    pub req: u64,
    pub offset: u64,
    pub data: Vec<u8>,
    pub eof: bool,
}

/// The open inputs, by the id of the command they feed (held by the hub, which outlives
/// every host connection).
#[derive(Default)]
pub struct Feeds {
    open: Mutex<HashMap<u64, Sender<Chunk>>>,
}

impl Feeds {
    /// Opens the input of command `exec`, before the command starts (its first chunk may
    /// arrive before it runs).
    pub fn open(&self, exec: u64) -> Receiver<Chunk> {
        let (tx, rx) = channel();
        lock(&self.open).insert(exec, tx);
        rx
    }

    /// Hands `chunk` to command `exec`'s writer; gives it back when the command has no open
    /// input (it ended, closed it, or never had one).
    pub fn push(&self, exec: u64, chunk: Chunk) -> Result<(), Chunk> {
        match lock(&self.open).get(&exec) {
            Some(tx) => tx.send(chunk).map_err(|e| e.0),
            None => Err(chunk),
        }
    }

    pub fn close(&self, exec: u64) {
        lock(&self.open).remove(&exec);
    }
}

/// Writes the chunks of `rx` to `pipe` in input order until end of input, replying to each.
/// A chunk past what was written leaves a gap: refused, so the host sends from where the
/// guest is.
pub fn write_all(rx: Receiver<Chunk>, mut pipe: impl Write, reply: &dyn Fn(Message)) {
    let mut written: u64 = 0;
    for c in rx {
        if c.offset > written {
            reply(Message::Error {
                id: c.req,
                message: format!("stdin: chunk at {} but {written} bytes written", c.offset),
            });
            continue;
        }
        let skip = usize::try_from(written - c.offset)
            .unwrap_or(usize::MAX)
            .min(c.data.len());
        let fresh = &c.data[skip..];
        match pipe.write_all(fresh).and_then(|_| pipe.flush()) {
            Ok(()) => written += fresh.len() as u64,
            Err(e) => {
                // The command closed its input (or ended): nothing more will be read.
                reply(Message::Error {
                    id: c.req,
                    message: format!("stdin: {e}"),
                });
                return;
            }
        }
        reply(Message::Ok { id: c.req });
        if c.eof {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(req: u64, offset: u64, data: &[u8], eof: bool) -> Chunk {
        Chunk {
            req,
            offset,
            data: data.to_vec(),
            eof,
        }
    }

    #[test]
    fn chunks_sent_again_are_written_once_and_gaps_refused() {
        let feeds = Feeds::default();
        let rx = feeds.open(7);
        for c in [
            chunk(1, 0, b"hello ", false),
            // Sent again after a move, with more: only the new bytes are written.
            chunk(2, 3, b"lo wor", false),
            chunk(3, 20, b"gap", false),
            chunk(4, 9, b"ld\n", true),
        ] {
            feeds.push(7, c).unwrap();
        }
        assert!(feeds.push(8, chunk(5, 0, b"x", false)).is_err());
        feeds.close(7);
        let replies = Mutex::new(Vec::new());
        let mut out = Vec::new();
        write_all(rx, &mut out, &|m| lock(&replies).push(m));
        assert_eq!(out, b"hello world\n");
        let replies = replies.into_inner().unwrap();
        assert_eq!(replies.len(), 4);
        assert!(
            matches!(replies[2], Message::Error { id: 3, .. }),
            "{replies:?}"
        );
        assert!(matches!(replies[3], Message::Ok { id: 4 }));
    }
}
