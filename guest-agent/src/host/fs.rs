//! A host end's side of its guest's shares: each operation the guest sends is done once per
//! request id, on a thread of its own (a slow disk must not hold up the channel), and
//! answered. The guest sends an operation again when a host end may have missed it (after a
//! switchover, or a long silence), so the same id can arrive twice: an operation being done
//! is not started again, and one done lately is answered again from its kept answer, never
//! done twice (a repeated create must not bring back a file the job removed meanwhile).
//! Reads are not kept (their data would be): a repeated read is read again.

use super::inner::lock;
use crate::share::calls::Answer;
use crate::share::proto::{FsOp, FsResult};
use crate::share::server::ShareSet;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Operations done at once on their own threads; past this, the channel's reader does them
/// itself (a guest that floods the channel slows itself down, not the host).
const THREADS: usize = 16;
/// Answers kept for operations sent again.
const KEPT: usize = 1024;

#[derive(Default)]
struct State {
    running: usize,
    doing: HashSet<u64>,
    done: HashMap<u64, FsResult>,
    order: VecDeque<u64>,
}

pub(super) struct FsServer {
    pub set: Arc<ShareSet>,
    state: Mutex<State>,
    idle: Condvar,
}

enum Next {
    Do,
    Again(FsResult),
    Wait,
}

impl FsServer {
    pub fn new(set: Arc<ShareSet>) -> Self {
        FsServer {
            set,
            state: Mutex::new(State::default()),
            idle: Condvar::new(),
        }
    }

    fn admit(&self, req: u64) -> Next {
        let mut st = lock(&self.state);
        if let Some(r) = st.done.get(&req) {
            return Next::Again(r.clone());
        }
        if !st.doing.insert(req) {
            return Next::Wait;
        }
        st.running += 1;
        Next::Do
    }

    fn finish(&self, req: u64, r: &FsResult) {
        let mut st = lock(&self.state);
        st.doing.remove(&req);
        st.running -= 1;
        self.idle.notify_all();
        if matches!(r, FsResult::Data) {
            return;
        }
        st.done.insert(req, r.clone());
        st.order.push_back(req);
        if st.order.len() > KEPT
            && let Some(old) = st.order.pop_front()
        {
            st.done.remove(&old);
        }
    }

    /// Does (or answers again) operation `req` with its payload `data`, and hands the answer
    /// to `reply`.
    pub fn serve(
        self: &Arc<Self>,
        (req, share, retry): (u64, u32, bool),
        op: FsOp,
        data: Vec<u8>,
        reply: impl FnOnce(Answer) + Send + 'static,
    ) {
        match self.admit(req) {
            Next::Again(r) => reply((r, Vec::new())),
            Next::Wait => {}
            Next::Do => {
                let me = self.clone();
                let work = move || {
                    let (r, out) = me.set.handle(share, &op, &data, retry);
                    me.finish(req, &r);
                    reply((r, out));
                };
                if lock(&self.state).running > THREADS {
                    work();
                } else {
                    std::thread::spawn(work);
                }
            }
        }
    }

    /// Waits (at most `limit`) until no operation is being done.
    pub fn wait_idle(&self, limit: Duration) {
        let st = lock(&self.state);
        let _ = self
            .idle
            .wait_timeout_while(st, limit, |s| s.running > 0)
            .map(drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::server::Shared;
    use std::sync::mpsc::channel;

    #[test]
    fn an_operation_sent_twice_is_done_once_and_answered_twice() {
        let dir = tempfile::tempdir().unwrap();
        let set = ShareSet::open(&[Shared {
            host: dir.path().to_path_buf(),
            guest: "/s".into(),
            ro: false,
            optional: false,
        }])
        .unwrap();
        let f = Arc::new(FsServer::new(Arc::new(set)));
        let (tx, rx) = channel();
        let mk = FsOp::Create {
            path: "a".into(),
            mode: 0o644,
            excl: true,
        };
        let t = tx.clone();
        f.serve((7, 0, false), mk.clone(), Vec::new(), move |r| {
            t.send(r.0).unwrap()
        });
        assert!(matches!(rx.recv().unwrap(), FsResult::Attr(_)));
        std::fs::remove_file(dir.path().join("a")).unwrap();
        // Sent again (retry) after the job removed the file: answered, not done again.
        f.serve((7, 0, true), mk, Vec::new(), move |r| tx.send(r.0).unwrap());
        assert!(matches!(rx.recv().unwrap(), FsResult::Attr(_)));
        assert!(!dir.path().join("a").exists());
        f.wait_idle(Duration::from_secs(5));
        assert_eq!(lock(&f.state).running, 0);
    }
}
