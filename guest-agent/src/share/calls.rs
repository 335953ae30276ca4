//! The guest's share operations waiting for the host's answer. An operation is sent once; if
//! the host end changes (a migration's switchover, a restore: the guest sees a new session,
//! or the new end asks) or no answer comes for a long while, it is sent again marked `retry`,
//! to whichever host end is there by then. That end does an id at most once; one the old end
//! did already counts as done by the host's rules for a retry. Answers to an operation
//! already answered are dropped.

use super::proto::{FsOp, FsResult};
use crate::protocol::Message;
use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

/// An operation unanswered this long is sent again (then again after as long): the last
/// resort, for a host end that neither the guest saw arrive nor said so.
pub const RESEND_AFTER: Duration = Duration::from_secs(60);

/// An answer: the result, and its payload (a read's data).
pub type Answer = (FsResult, Vec<u8>);

struct Waiting {
    share: u32,
    op: FsOp,
    /// The operation's payload (a write's data), kept to send again.
    data: Vec<u8>,
    tx: Sender<Answer>,
    sent: Instant,
}

#[derive(Default)]
pub struct Calls {
    next: u64,
    waiting: HashMap<u64, Waiting>,
}

impl Calls {
    /// Registers an operation with its payload `data`; returns its first message.
    pub fn start(&mut self, share: u32, op: FsOp, data: &[u8], tx: Sender<Answer>) -> Message {
        self.next += 1;
        let req = self.next;
        let m = message(req, share, &op, data, false);
        self.waiting.insert(
            req,
            Waiting {
                share,
                op,
                data: data.to_vec(),
                tx,
                sent: Instant::now(),
            },
        );
        m
    }

    /// The messages to send again: all (`due` = None, a new host end), or those unanswered
    /// for [`RESEND_AFTER`] by `due`.
    pub fn resend(&mut self, due: Option<Instant>) -> Vec<(Message, Vec<u8>)> {
        let mut out = Vec::new();
        for (&req, w) in self.waiting.iter_mut() {
            if due.is_some_and(|now| now.duration_since(w.sent) < RESEND_AFTER) {
                continue;
            }
            w.sent = due.unwrap_or_else(Instant::now);
            let m = message(req, w.share, &w.op, &w.data, true);
            out.push((req, m, w.data.clone()));
        }
        out.sort_by_key(|(req, ..)| *req);
        out.into_iter().map(|(_, m, d)| (m, d)).collect()
    }

    pub fn answer(&mut self, req: u64, r: Answer) {
        if let Some(w) = self.waiting.remove(&req) {
            let _ = w.tx.send(r);
        }
    }

    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.waiting.len()
    }
}

fn message(req: u64, share: u32, op: &FsOp, data: &[u8], retry: bool) -> Message {
    Message::Fs {
        req,
        share,
        op: op.clone(),
        retry,
        bytes: data.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanswered_operations_are_sent_again_marked_retry_and_answered_once() {
        let mut c = Calls::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let first = c.start(0, FsOp::Statfs, &[], tx.clone());
        let write = FsOp::Write {
            path: "x".into(),
            offset: 0,
        };
        let second = c.start(1, write, b"data", tx);
        assert!(matches!(
            first,
            Message::Fs {
                req: 1,
                retry: false,
                bytes: 0,
                ..
            }
        ));
        assert!(matches!(
            second,
            Message::Fs {
                req: 2,
                bytes: 4,
                ..
            }
        ));
        assert!(c.resend(Some(Instant::now())).is_empty(), "not due yet");
        let again = c.resend(None);
        assert_eq!(again.len(), 2);
        assert!(
            again
                .iter()
                .all(|(m, _)| matches!(m, Message::Fs { retry: true, .. }))
        );
        assert_eq!(again[1].1, b"data", "the payload goes again");
        c.answer(2, (FsResult::Done, Vec::new()));
        c.answer(2, (FsResult::Err { errno: 2 }, Vec::new()));
        assert_eq!(rx.try_recv().unwrap().0, FsResult::Done);
        assert!(rx.try_recv().is_err(), "a second answer is dropped");
        let later = Instant::now() + RESEND_AFTER;
        assert_eq!(c.resend(Some(later)).len(), 1);
        c.answer(1, (FsResult::Done, Vec::new()));
        assert_eq!(c.pending(), 0);
    }
}
