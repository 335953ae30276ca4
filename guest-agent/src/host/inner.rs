//! The shared state of one link: the current host end of the channel (or the lines queued
//! while there is none), the waiters of requests by id, the reader thread of each host end,
//! and the relay of the guest ranks' barrier lines.

use super::{Barriers, LinkError};
use crate::protocol::{Message, PROTOCOL_VERSION, Request};
use crate::share::proto::{FsOp, FsResult, MAX_PAYLOAD, checksum};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

/// A poisoned lock only means another thread panicked while holding it; the maps and queues
/// behind these locks stay consistent line by line, so the link goes on.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
pub(super) struct Out {
    pub stream: Option<UnixStream>,
    pub pending: VecDeque<Vec<u8>>,
}

pub(super) struct Inner {
    pub barriers: Barriers,
    pub out: Mutex<Out>,
    /// Guest connection → this link's connection to the barrier server.
    pub ranks: Mutex<HashMap<u64, UnixStream>>,
    pub replies: Mutex<HashMap<u64, Sender<Message>>>,
    /// Output and exits of commands an earlier link started (ids below this link's first),
    /// that came before this link adopted them: kept for [`GuestLink::adopt_exec`], in order.
    pub unclaimed: Mutex<VecDeque<Message>>,
    /// This link's first request id.
    pub first_id: u64,
    pub next_id: AtomicU64,
    pub generation: AtomicU64,
    /// Told the agent's `Ready` (or that the channel closed) while a host end is attaching.
    pub ready: Mutex<Option<Sender<Result<String, LinkError>>>>,
    /// The reader of the current (or last) host end.
    pub reader: Mutex<Option<Reader>>,
    /// The guest's shares, served by this host end.
    pub fs: Option<Arc<super::fs::FsServer>>,
}

/// A host end's reader thread, which ends with the start of a line the end was cut in.
pub(super) struct Reader {
    /// The end itself, to stop its reading.
    pub stream: UnixStream,
    pub thread: std::thread::JoinHandle<Vec<u8>>,
}

impl Reader {
    /// Stops reading once the end holds nothing more (the guest's state has moved on: no more
    /// comes), and returns the start of a line the end was cut in.
    pub fn finish(self) -> Vec<u8> {
        let _ = self.stream.shutdown(std::net::Shutdown::Read);
        self.thread.join().unwrap_or_default()
    }
}

/// Messages kept for adoption at most (a restored or migrated VM's output of a moment).
const MAX_UNCLAIMED: usize = 4096;

/// Longest line a guest (or a barrier server) may send, newline included: a guest that
/// never ends its line must not make the host buffer without end. Output travels in chunks
/// of 16 KiB; a whole-output `exec` reply above this is refused (use `exec-stream`).
pub(super) const MAX_LINE: usize = 64 << 20;

/// One line of at most `max` bytes into `buf` (cleared first); 0 at end of file.
pub(super) fn read_line_bounded(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    use std::io::Read;
    buf.clear();
    let n = r.by_ref().take(max as u64).read_until(b'\n', buf)?;
    if n == max && buf.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {max} bytes"),
        ));
    }
    Ok(n)
}

pub(super) fn encode(r: &Request) -> Vec<u8> {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    line
}

impl Inner {
    pub fn new(
        barriers: Barriers,
        first_id: u64,
        shares: Option<Arc<crate::share::server::ShareSet>>,
    ) -> Self {
        Inner {
            barriers,
            out: Mutex::new(Out::default()),
            ranks: Mutex::new(HashMap::new()),
            replies: Mutex::new(HashMap::new()),
            unclaimed: Mutex::new(VecDeque::new()),
            first_id: first_id.max(1),
            next_id: AtomicU64::new(first_id.max(1)),
            generation: AtomicU64::new(0),
            ready: Mutex::new(None),
            reader: Mutex::new(None),
            fs: shares.map(|s| Arc::new(super::fs::FsServer::new(s))),
        }
    }

    /// Does a guest's share operation (see [`super::fs`]) with its payload `data`, and
    /// answers it.
    fn fs(self: &Arc<Self>, (req, share, retry): (u64, u32, bool), op: FsOp, data: Vec<u8>) {
        let me = self.clone();
        let answer = move |(result, data): (FsResult, Vec<u8>)| {
            let (bytes, sum) = (data.len() as u32, checksum(&data));
            let r = Request::FsReply {
                req,
                result,
                bytes,
                sum,
            };
            me.send_with(&r, &data)
        };
        match &self.fs {
            Some(fs) => fs.serve((req, share, retry), op, data, answer),
            None => answer((
                FsResult::Err {
                    errno: libc::ENODEV,
                },
                Vec::new(),
            )),
        }
    }

    /// Sends now, or queues the line until the next host end is attached.
    pub fn send(&self, r: &Request) {
        self.send_with(r, &[]);
    }

    /// [`Inner::send`] with a payload after the line.
    fn send_with(&self, r: &Request, payload: &[u8]) {
        let mut line = encode(r);
        line.extend_from_slice(payload);
        let mut out = lock(&self.out);
        if let Some(s) = out.stream.as_mut() {
            if s.write_all(&line).is_ok() {
                return;
            }
            out.stream = None;
        }
        out.pending.push_back(line);
    }

    /// One message from the guest, with its payload (a share operation's data).
    fn on_message(self: &Arc<Self>, m: Message, payload: Vec<u8>) {
        match m {
            Message::Ready { version, kernel } => {
                let r = if version == PROTOCOL_VERSION {
                    Ok(kernel)
                } else {
                    Err(LinkError::Version(version))
                };
                if let Some(tx) = lock(&self.ready).take() {
                    let _ = tx.send(r);
                }
            }
            Message::Barrier { conn, line } => self.from_rank(conn, &line),
            Message::Fs {
                req,
                share,
                op,
                retry,
                ..
            } => self.fs((req, share, retry), op, payload),
            Message::BarrierClosed { conn } => match &self.barriers {
                Barriers::Relay(r) => r.closed(conn),
                Barriers::Socket(_) => {
                    if let Some(s) = lock(&self.ranks).get(&conn) {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                }
                Barriers::None => {}
            },
            // A streamed command's output: more follows, keep the waiter registered.
            Message::Output { id, .. } => {
                let replies = lock(&self.replies);
                match replies.get(&id) {
                    Some(tx) => {
                        let _ = tx.send(m);
                    }
                    None => self.unclaimed(m),
                }
            }
            // A request the agent could not even parse (an image whose agent predates it):
            // every waiter hears why rather than waiting for an answer that never comes.
            Message::Error { id: 0, message } => {
                let waiting: Vec<_> = lock(&self.replies).drain().collect();
                for (id, tx) in waiting {
                    let _ = tx.send(Message::Error {
                        id,
                        message: message.clone(),
                    });
                }
            }
            other => {
                let Some(id) = other.id() else { return };
                let mut replies = lock(&self.replies);
                match replies.remove(&id) {
                    Some(tx) => {
                        let _ = tx.send(other);
                    }
                    None if matches!(other, Message::Exited { .. }) => self.unclaimed(other),
                    None => {}
                }
            }
        }
    }

    /// Keeps `m` (no waiter has its id) when an earlier link's command sent it: the command
    /// may be adopted in a moment. Called with `replies` locked, which `adopt_exec` holds
    /// while it takes them, so nothing is kept after its adoption.
    fn unclaimed(&self, m: Message) {
        if m.id().is_some_and(|id| id < self.first_id) {
            let mut kept = lock(&self.unclaimed);
            if kept.len() == MAX_UNCLAIMED {
                kept.pop_front();
            }
            kept.push_back(m);
        }
    }

    /// A guest rank's line: its first (HELLO) opens the rank's server connection.
    fn from_rank(self: &Arc<Self>, conn: u64, line: &str) {
        let server = match &self.barriers {
            Barriers::Relay(r) => return r.up(conn, line),
            Barriers::Socket(p) => p,
            // No controller: the rank sees end-of-file and goes on (its library's rule).
            Barriers::None => return self.send(&Request::BarrierClose { conn }),
        };
        let mut ranks = lock(&self.ranks);
        if let std::collections::hash_map::Entry::Vacant(slot) = ranks.entry(conn) {
            let Ok(stream) = UnixStream::connect(server) else {
                self.send(&Request::BarrierClose { conn });
                return;
            };
            let Ok(reader) = stream.try_clone() else {
                return;
            };
            slot.insert(stream);
            let me = self.clone();
            std::thread::spawn(move || {
                let (mut r, mut buf) = (BufReader::new(reader), Vec::new());
                while let Ok(1..) = read_line_bounded(&mut r, &mut buf, MAX_LINE) {
                    let Ok(line) = std::str::from_utf8(&buf) else {
                        break;
                    };
                    let line = line.trim_end_matches('\n').to_string();
                    me.send(&Request::Barrier { conn, line });
                }
                lock(&me.ranks).remove(&conn);
                me.send(&Request::BarrierClose { conn });
            });
        }
        if let Some(s) = ranks.get_mut(&conn) {
            let _ = s.write_all(format!("{}\n", line.trim_end()).as_bytes());
        }
    }
}

/// Reads one host end, after `start` (what an earlier end read of a line it was cut in),
/// until it closes; returns the start of a line this end was cut in. A later host end (a
/// reattach) has a newer generation: the old reader's end then changes nothing.
pub(super) fn read_loop(
    inner: Arc<Inner>,
    stream: UnixStream,
    start: Vec<u8>,
    generation: u64,
) -> Vec<u8> {
    let mut reader = BufReader::new(std::io::Cursor::new(start).chain(stream));
    let mut buf = Vec::new();
    let cut = loop {
        match read_line_bounded(&mut reader, &mut buf, MAX_LINE) {
            Ok(0) => break Vec::new(),
            Ok(_) if buf.last() != Some(&b'\n') => break std::mem::take(&mut buf),
            Ok(_) => {}
            // The guest is not speaking the protocol (or is hostile): its channel ends.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("vse: guest agent channel: the guest sent {e}; closing the channel");
                break Vec::new();
            }
            // A hypervisor that quits with our requests unread resets the socket, after
            // everything it wrote was read: what came of the last line is kept.
            Err(_) => break std::mem::take(&mut buf),
        }
        let parsed = {
            let line = String::from_utf8_lossy(&buf);
            // A virtio-serial port can carry noise from before the agent opened it.
            let t = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
            t.starts_with('{')
                .then(|| serde_json::from_str::<Message>(t).ok())
                .flatten()
        };
        let Some(m) = parsed else {
            continue;
        };
        // A share operation's data follows its line; cut short, the line and what came of
        // the data go to the next end's reader, which reads the rest.
        let bytes = match &m {
            Message::Fs { bytes, .. } => *bytes,
            _ => 0,
        };
        if bytes > MAX_PAYLOAD {
            eprintln!("vse: guest agent channel: a payload of {bytes} bytes; closing the channel");
            break Vec::new();
        }
        let mut payload = Vec::with_capacity(bytes as usize);
        match (&mut reader)
            .take(u64::from(bytes))
            .read_to_end(&mut payload)
        {
            Ok(n) if n == bytes as usize => inner.on_message(m, payload),
            _ => {
                buf.extend_from_slice(&payload);
                break std::mem::take(&mut buf);
            }
        }
    };
    if inner.generation.load(Ordering::SeqCst) == generation {
        lock(&inner.out).stream = None;
        // A host end closing while it attaches: the hypervisor is gone, stop waiting.
        if let Some(tx) = lock(&inner.ready).take() {
            let _ = tx.send(Err(LinkError::Closed));
        }
    }
    cut
}

impl std::fmt::Debug for Barriers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Barriers::None => f.write_str("None"),
            Barriers::Socket(p) => f.debug_tuple("Socket").field(p).finish(),
            Barriers::Relay(_) => f.write_str("Relay(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_bound_are_refused() {
        let mut r = std::io::Cursor::new(b"short\nlonger than ten\n".to_vec());
        let mut buf = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut buf, 10).unwrap(), 6);
        assert_eq!(buf, b"short\n");
        let e = read_line_bounded(&mut r, &mut buf, 10).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
        let mut r = std::io::Cursor::new(b"exactly 9\n".to_vec());
        assert_eq!(read_line_bounded(&mut r, &mut buf, 10).unwrap(), 10);
        assert_eq!(read_line_bounded(&mut r, &mut buf, 10).unwrap(), 0);
    }
}
