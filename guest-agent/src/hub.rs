//! Everything the guest sends to the host goes through the hub: replies (from concurrent exec
//! threads) and the barrier relay. The host channel comes and goes (a live migration swaps
//! the host end), so the hub queues what cannot be sent and flushes it after the next
//! `Ready`; ranks connected to the guest barrier socket never notice the swap.
//!
//! The relay is push-based: a rank's barrier check reads its own socket without a round trip
//! to the host; lines travel only when the controller posts a notice or a rank reports ready.

use crate::protocol::Message;
use crate::share::calls::Answer;
use crate::share::proto::{FsOp, FsResult};
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Writer = Box<dyn Write + Send>;

#[derive(Default)]
struct Out {
    writer: Option<Writer>,
    /// Lines waiting for a host end (bounded: a host that never returns must not eat memory).
    pending: VecDeque<Vec<u8>>,
}

const MAX_PENDING: usize = 4096;

#[derive(Default)]
pub struct Hub {
    out: Mutex<Out>,
    ranks: Mutex<HashMap<u64, UnixStream>>,
    next: AtomicU64,
    /// Commands' streamed inputs: like the ranks, they outlive a host end.
    pub feeds: crate::stdin::Feeds,
    /// Share operations waiting for the host (locked after `out`, never before).
    calls: Mutex<crate::share::calls::Calls>,
    pub mounts: crate::share::mount::Mounts,
}

fn encode(m: &Message) -> Vec<u8> {
    let mut line = serde_json::to_vec(m).unwrap_or_default();
    line.push(b'\n');
    line
}

impl Hub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock_out(&self) -> std::sync::MutexGuard<'_, Out> {
        lock(&self.out)
    }

    /// A new host end: `first` (the `Ready`) goes out before anything queued.
    pub fn attach(&self, mut writer: Writer, first: &Message) -> std::io::Result<()> {
        let mut out = self.lock_out();
        writer.write_all(&encode(first))?;
        while let Some(line) = out.pending.pop_front() {
            if let Err(e) = writer.write_all(&line) {
                out.pending.push_front(line);
                return Err(e);
            }
        }
        // Share operations a previous host end may not have answered go to this one.
        for (m, d) in lock(&self.calls).resend(None) {
            writer.write_all(&encode(&m))?;
            writer.write_all(&d)?;
        }
        writer.flush()?;
        out.writer = Some(writer);
        Ok(())
    }

    /// Writes `m` and its payload `data` if a host end is attached, without queueing (share
    /// operations are sent again by [`Hub::attach`] instead).
    fn send_now(out: &mut Out, m: &Message, data: &[u8]) {
        if let Some(w) = out.writer.as_mut()
            && w.write_all(&encode(m))
                .and_then(|_| w.write_all(data))
                .and_then(|_| w.flush())
                .is_err()
        {
            out.writer = None;
        }
    }

    /// A share operation with its payload `data`: sent to the host, and again (marked retry)
    /// until it is answered.
    pub fn fs_call(&self, share: u32, op: FsOp, data: &[u8]) -> Answer {
        use crate::share::calls::RESEND_AFTER;
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let mut out = self.lock_out();
            let m = lock(&self.calls).start(share, op, data, tx);
            Self::send_now(&mut out, &m, data);
        }
        loop {
            match rx.recv_timeout(RESEND_AFTER / 2) {
                Ok(r) => return r,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let mut out = self.lock_out();
                    let due = lock(&self.calls).resend(Some(std::time::Instant::now()));
                    for (m, d) in due {
                        Self::send_now(&mut out, &m, &d);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return (FsResult::Err { errno: libc::EIO }, Vec::new());
                }
            }
        }
    }

    /// Sends every unanswered share operation again (a new host end asked).
    pub fn fs_resend(&self) {
        let mut out = self.lock_out();
        for (m, d) in lock(&self.calls).resend(None) {
            Self::send_now(&mut out, &m, &d);
        }
    }

    /// The host's answer to share operation `req`, with its payload.
    pub fn fs_answer(&self, req: u64, r: Answer) {
        lock(&self.calls).answer(req, r);
    }

    pub fn detach(&self) {
        self.lock_out().writer = None;
    }

    /// Sends now, or queues until the next host end if there is none (or it just failed).
    pub fn send(&self, m: &Message) {
        let line = encode(m);
        let mut out = self.lock_out();
        if let Some(w) = out.writer.as_mut() {
            if w.write_all(&line).and_then(|_| w.flush()).is_ok() {
                return;
            }
            out.writer = None;
        }
        if out.pending.len() >= MAX_PENDING {
            out.pending.pop_front();
        }
        out.pending.push_back(line);
    }

    /// A line from the controller to the rank on `conn`.
    pub fn to_rank(&self, conn: u64, line: &str) {
        let ranks = lock(&self.ranks);
        if let Some(mut s) = ranks.get(&conn) {
            let _ = s.write_all(format!("{}\n", line.trim_end()).as_bytes());
        }
    }

    /// The controller's side of `conn` went away: the rank reads end-of-file.
    pub fn close_rank(&self, conn: u64) {
        let ranks = lock(&self.ranks);
        if let Some(s) = ranks.get(&conn) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Ranks connected now.
    pub fn rank_count(&self) -> usize {
        lock(&self.ranks).len()
    }

    /// Serves the guest barrier socket at `path` on a background thread.
    pub fn listen(self: &Arc<Self>, path: &Path) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        // Ranks run as the job's user: every process in the VM is the job's.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        let hub = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                hub.clone().add_rank(stream);
            }
        });
        Ok(())
    }

    /// Relays one rank connection (also used directly by tests, with a socket pair).
    pub fn add_rank(self: Arc<Self>, stream: UnixStream) {
        let conn = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let Ok(reader) = stream.try_clone() else {
            return;
        };
        lock(&self.ranks).insert(conn, stream);
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                self.send(&Message::Barrier { conn, line });
            }
            lock(&self.ranks).remove(&conn);
            self.send(&Message::BarrierClosed { conn });
        });
    }
}

impl crate::share::fs::Remote for Hub {
    fn call(&self, share: u32, op: FsOp, data: &[u8]) -> Answer {
        self.fs_call(share, op, data)
    }
}
