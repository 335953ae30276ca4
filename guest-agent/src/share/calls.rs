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

struct Waiting {
    share: u32,
    op: FsOp,
    tx: Sender<FsResult>,
    sent: Instant,
}

#[derive(Default)]
pub struct Calls {
    next: u64,
    waiting: HashMap<u64, Waiting>,
}

impl Calls {
    /// Registers an operation; returns its request id and its first message.
    pub fn start(&mut self, share: u32, op: FsOp, tx: Sender<FsResult>) -> (u64, Message) {
        self.next += 1;
        let req = self.next;
        let m = Message::Fs {
            req,
            share,
            op: op.clone(),
            retry: false,
        };
        self.waiting.insert(
            req,
            Waiting {
                share,
                op,
                tx,
                sent: Instant::now(),
            },
        );
        (req, m)
    }

    /// The messages to send again: all (`due` = None, a new host end), or those unanswered
    /// for [`RESEND_AFTER`] by `due`.
    pub fn resend(&mut self, due: Option<Instant>) -> Vec<Message> {
        let mut out = Vec::new();
        for (&req, w) in self.waiting.iter_mut() {
            if due.is_some_and(|now| now.duration_since(w.sent) < RESEND_AFTER) {
                continue;
            }
            w.sent = due.unwrap_or_else(Instant::now);
            out.push(Message::Fs {
                req,
                share: w.share,
                op: w.op.clone(),
                retry: true,
            });
        }
        out.sort_by_key(|m| match m {
            Message::Fs { req, .. } => *req,
            _ => 0,
        });
        out
    }

    pub fn answer(&mut self, req: u64, r: FsResult) {
        if let Some(w) = self.waiting.remove(&req) {
            let _ = w.tx.send(r);
        }
    }

    pub fn pending(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanswered_operations_are_sent_again_marked_retry_and_answered_once() {
        let mut c = Calls::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let (a, first) = c.start(0, FsOp::Statfs, tx.clone());
        let (b, _) = c.start(1, FsOp::Stat { path: "x".into() }, tx);
        assert!(matches!(first, Message::Fs { retry: false, .. }));
        assert!(c.resend(Some(Instant::now())).is_empty(), "not due yet");
        let again = c.resend(None);
        assert_eq!(again.len(), 2);
        assert!(
            again
                .iter()
                .all(|m| matches!(m, Message::Fs { retry: true, .. }))
        );
        c.answer(b, FsResult::Done);
        c.answer(b, FsResult::Err { errno: 2 });
        assert_eq!(rx.try_recv().unwrap(), FsResult::Done);
        assert!(rx.try_recv().is_err(), "a second answer is dropped");
        let later = Instant::now() + RESEND_AFTER;
        assert_eq!(c.resend(Some(later)).len(), 1);
        c.answer(a, FsResult::Done);
        assert_eq!(c.pending(), 0);
    }
}
