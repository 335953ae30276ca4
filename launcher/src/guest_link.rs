//! Host end of a VM's guest agent channel, owned by the controller for the VM's whole life:
//! it relays the barrier traffic of the ranks inside the guest to the [`BarrierServer`]
//! (one server connection per guest rank, so the server sees ordinary ranks), asks the guest
//! for its own view of memory and CPU, and runs commands. After a live migration
//! [`GuestLink::reattach`] moves it to the destination's socket; lines the controller sends
//! meanwhile are queued, and the ranks' server connections stay open throughout.
//!
//! [`BarrierServer`]: super::BarrierServer

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vse_guest_agent::ExecOutput;
use vse_guest_agent::protocol::{Message, OutStream, PROTOCOL_VERSION, Request};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("guest agent socket {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("guest agent at {path} did not say ready within {waited:?}")]
    NotReady { path: PathBuf, waited: Duration },
    #[error("guest agent speaks protocol {0}, this controller speaks {PROTOCOL_VERSION}")]
    Version(u32),
    #[error("guest agent gave no reply to request {id} within {waited:?}")]
    Timeout { id: u64, waited: Duration },
    #[error("guest agent: {0}")]
    Agent(String),
}

#[derive(Default)]
struct Out {
    stream: Option<UnixStream>,
    pending: VecDeque<Vec<u8>>,
}

/// Where a link sends the barrier lines of the guest's ranks when the controller is not on
/// this host (a node agent relays them over the job's authenticated overlay). `conn` is the
/// guest agent's id of the rank's connection: it stays the same when the VM migrates, so the
/// controller can answer a rank through whichever node holds the VM by then.
pub trait BarrierRelay: Send + Sync {
    fn up(&self, conn: u64, line: &str);
    fn closed(&self, conn: u64);
}

enum Relay {
    /// The controller's barrier server socket on this host: one connection per rank.
    Socket(PathBuf),
    Custom(Arc<dyn BarrierRelay>),
}

struct Inner {
    relay: Relay,
    out: Mutex<Out>,
    /// Guest connection → this link's connection to the barrier server.
    ranks: Mutex<HashMap<u64, UnixStream>>,
    replies: Mutex<HashMap<u64, Sender<Message>>>,
    next_id: AtomicU64,
    generation: AtomicU64,
    ready: Mutex<Option<Sender<Result<String, LinkError>>>>,
}

pub struct GuestLink {
    inner: Arc<Inner>,
    kernel: Mutex<String>,
}

fn encode(r: &Request) -> Vec<u8> {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    line
}

impl Inner {
    fn send(&self, r: &Request) {
        let line = encode(r);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = out.stream.as_mut() {
            if s.write_all(&line).is_ok() {
                return;
            }
            out.stream = None;
        }
        out.pending.push_back(line);
    }

    fn on_message(self: &Arc<Self>, m: Message) {
        match m {
            Message::Ready { version, kernel } => {
                let r = if version == PROTOCOL_VERSION {
                    Ok(kernel)
                } else {
                    Err(LinkError::Version(version))
                };
                if let Some(tx) = self.ready.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = tx.send(r);
                }
            }
            Message::Barrier { conn, line } => self.from_rank(conn, &line),
            Message::BarrierClosed { conn } if matches!(self.relay, Relay::Custom(_)) => {
                if let Relay::Custom(r) = &self.relay {
                    r.closed(conn);
                }
            }
            Message::BarrierClosed { conn } => {
                let ranks = self.ranks.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(s) = ranks.get(&conn) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
            // A streamed command's output: more follows, keep the waiter registered.
            Message::Output { id, .. } => {
                let replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(tx) = replies.get(&id) {
                    let _ = tx.send(m);
                }
            }
            // A request the agent could not even parse (an image whose agent predates it):
            // every waiter hears why rather than waiting for an answer that never comes.
            Message::Error { id: 0, message } => {
                let waiting: Vec<_> = self
                    .replies
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain()
                    .collect();
                for (id, tx) in waiting {
                    let _ = tx.send(Message::Error {
                        id,
                        message: message.clone(),
                    });
                }
            }
            other => {
                let Some(id) = other.id() else { return };
                let tx = self
                    .replies
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                if let Some(tx) = tx {
                    let _ = tx.send(other);
                }
            }
        }
    }

    /// A guest rank's line: its first (HELLO) opens the rank's server connection.
    fn from_rank(self: &Arc<Self>, conn: u64, line: &str) {
        let server = match &self.relay {
            Relay::Custom(r) => return r.up(conn, line),
            Relay::Socket(p) => p,
        };
        let mut ranks = self.ranks.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Vacant(slot) = ranks.entry(conn) {
            let Ok(stream) = UnixStream::connect(server) else {
                // No controller: the rank sees end-of-file and goes on (its library's rule).
                self.send(&Request::BarrierClose { conn });
                return;
            };
            let Ok(reader) = stream.try_clone() else {
                return;
            };
            slot.insert(stream);
            let me = self.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(reader).lines() {
                    let Ok(line) = line else { break };
                    me.send(&Request::Barrier { conn, line });
                }
                me.ranks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&conn);
                me.send(&Request::BarrierClose { conn });
            });
        }
        if let Some(s) = ranks.get_mut(&conn) {
            let _ = s.write_all(format!("{}\n", line.trim_end()).as_bytes());
        }
    }
}

fn read_loop(inner: Arc<Inner>, stream: UnixStream, generation: u64) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // A virtio-serial port can carry noise from before the agent opened it.
        let t = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        if !t.starts_with('{') {
            continue;
        }
        if let Ok(m) = serde_json::from_str::<Message>(t) {
            inner.on_message(m);
        }
    }
    if inner.generation.load(Ordering::SeqCst) == generation {
        inner.out.lock().unwrap_or_else(|e| e.into_inner()).stream = None;
    }
}

impl GuestLink {
    /// Connects to the agent socket of a running VM and waits for the agent's `Ready`.
    pub fn connect(
        agent_socket: &Path,
        barrier_server: &Path,
        timeout: Duration,
    ) -> Result<Self, LinkError> {
        Self::connect_with(
            agent_socket,
            Relay::Socket(barrier_server.to_path_buf()),
            timeout,
            1,
        )
    }

    /// Like [`GuestLink::connect`], with the ranks' barrier lines going to `relay`.
    /// `first_id`: request ids start there, above any id a previous host end of the same
    /// guest used (see [`GuestLink::adopt_exec`]).
    pub fn connect_relay(
        agent_socket: &Path,
        relay: Arc<dyn BarrierRelay>,
        timeout: Duration,
        first_id: u64,
    ) -> Result<Self, LinkError> {
        Self::connect_with(agent_socket, Relay::Custom(relay), timeout, first_id)
    }

    /// The next request id this link would use: a link that takes over the guest after a
    /// migration starts above it, so late replies to this one are never mistaken for its own.
    pub fn next_request_id(&self) -> u64 {
        self.inner.next_id.load(Ordering::Relaxed)
    }

    /// A line from the controller to the guest rank on connection `conn`.
    pub fn barrier_down(&self, conn: u64, line: &str) {
        self.inner.send(&Request::Barrier {
            conn,
            line: line.trim_end().to_string(),
        });
    }

    /// The controller closed rank connection `conn`: the rank sees end-of-file.
    pub fn barrier_close(&self, conn: u64) {
        self.inner.send(&Request::BarrierClose { conn });
    }

    /// Takes over a command another host end of this guest started (before a live
    /// migration): its reply comes to this link now, under the same request id.
    pub fn adopt_exec(&self, id: u64) -> PendingExec {
        let (tx, rx) = channel();
        self.inner
            .replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        PendingExec { id, rx }
    }

    fn connect_with(
        agent_socket: &Path,
        relay: Relay,
        timeout: Duration,
        first_id: u64,
    ) -> Result<Self, LinkError> {
        let link = GuestLink {
            inner: Arc::new(Inner {
                relay,
                out: Mutex::new(Out::default()),
                ranks: Mutex::new(HashMap::new()),
                replies: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(first_id.max(1)),
                generation: AtomicU64::new(0),
                ready: Mutex::new(None),
            }),
            kernel: Mutex::new(String::new()),
        };
        link.reattach_within(agent_socket, timeout)?;
        Ok(link)
    }

    /// Moves the link to another host end of the same guest (the destination of a live
    /// migration), then sends what was queued meanwhile.
    pub fn reattach(&self, agent_socket: &Path) -> Result<(), LinkError> {
        self.reattach_within(agent_socket, Duration::from_secs(60))
    }

    fn reattach_within(&self, path: &Path, timeout: Duration) -> Result<(), LinkError> {
        let inner = &self.inner;
        let generation = inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        inner.out.lock().unwrap_or_else(|e| e.into_inner()).stream = None;
        let deadline = Instant::now() + timeout;
        // QEMU creates the socket while starting: wait for it rather than fail at once.
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(source) if Instant::now() >= deadline => {
                    return Err(LinkError::Connect {
                        path: path.to_path_buf(),
                        source,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let reader = stream.try_clone().map_err(|source| LinkError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let (tx, rx) = channel();
        *inner.ready.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let me = inner.clone();
        std::thread::spawn(move || read_loop(me, reader, generation));
        // A fresh agent session starts with `Ready`. But the guest may not notice that the
        // host end was swapped (the new end connected before it saw the old one go), and then
        // its session simply goes on: a reply to a ping proves that just as well.
        let mut stream = stream;
        loop {
            let ping = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let (ptx, prx) = channel();
            inner
                .replies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ping, ptx);
            let _ = stream.write_all(&encode(&Request::Sample { id: ping }));
            let tick = Instant::now() + Duration::from_secs(1);
            let mut alive = false;
            while Instant::now() < tick && !alive {
                match rx.try_recv() {
                    Ok(r) => {
                        *self.kernel.lock().unwrap_or_else(|e| e.into_inner()) = r?;
                        alive = true;
                    }
                    Err(_) => alive = prx.recv_timeout(Duration::from_millis(20)).is_ok(),
                }
            }
            inner
                .replies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ping);
            if alive {
                break;
            }
            if Instant::now() >= deadline {
                return Err(LinkError::NotReady {
                    path: path.to_path_buf(),
                    waited: timeout,
                });
            }
        }
        let mut out = inner.out.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(line) = out.pending.pop_front() {
            if let Err(source) = stream.write_all(&line) {
                out.pending.push_front(line);
                return Err(LinkError::Connect {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        out.stream = Some(stream);
        Ok(())
    }

    /// The guest kernel release the agent announced.
    pub fn kernel(&self) -> String {
        self.kernel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn request(&self, make: impl FnOnce(u64) -> Request) -> (u64, Receiver<Message>) {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        self.inner
            .replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        self.inner.send(&make(id));
        (id, rx)
    }

    fn wait(id: u64, rx: &Receiver<Message>, timeout: Duration) -> Result<Message, LinkError> {
        match rx.recv_timeout(timeout) {
            Ok(Message::Error { message, .. }) => Err(LinkError::Agent(message)),
            Ok(m) => Ok(m),
            Err(_) => Err(LinkError::Timeout {
                id,
                waited: timeout,
            }),
        }
    }

    /// The guest's own `/proc/meminfo` and `/proc/stat` (seed 000 §IV-A: it disagrees with
    /// the host's view of the hypervisor process, and both are needed).
    pub fn sample(&self, timeout: Duration) -> Result<(String, String), LinkError> {
        let (id, rx) = self.request(|id| Request::Sample { id });
        match Self::wait(id, &rx, timeout)? {
            Message::Sample { meminfo, stat, .. } => Ok((meminfo, stat)),
            other => Err(LinkError::Agent(format!("unexpected reply {other:?}"))),
        }
    }

    /// Starts `argv` in the guest; the reply arrives on [`PendingExec::wait`], even if the VM
    /// migrates meanwhile.
    pub fn spawn(&self, argv: &[&str], env: BTreeMap<String, String>) -> PendingExec {
        self.start(argv, env, false, None)
    }

    /// Like [`GuestLink::spawn`], but the guest sends the output while the command runs:
    /// [`PendingExec::poll`] hands each chunk over as it arrives.
    pub fn spawn_stream(&self, argv: &[&str], env: BTreeMap<String, String>) -> PendingExec {
        self.start(argv, env, true, None)
    }

    /// [`GuestLink::spawn_stream`] in the guest directory `cwd`.
    pub fn spawn_stream_in(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        cwd: &str,
    ) -> PendingExec {
        self.start(argv, env, true, Some(cwd.to_string()))
    }

    fn start(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        stream: bool,
        cwd: Option<String>,
    ) -> PendingExec {
        let argv = argv.iter().map(|s| s.to_string()).collect();
        let (id, rx) = self.request(|id| {
            let stdin = None;
            if stream {
                Request::ExecStream {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                }
            } else {
                Request::Exec {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                }
            }
        });
        PendingExec { id, rx }
    }

    /// Configures the guest's job NIC (found by MAC), hostname and `/etc/hosts`, and with
    /// `rsh_key` the guest's rsh service for mpirun.
    pub fn net_config(&self, cfg: GuestNet<'_>, timeout: Duration) -> Result<(), LinkError> {
        let (id, rx) = self.request(|id| Request::NetConfig {
            id,
            mac: cfg.mac.into(),
            ip: cfg.ip,
            prefix: cfg.prefix,
            hostname: cfg.hostname.into(),
            hosts: cfg.hosts.to_vec(),
            rsh_key: cfg.rsh_key.map(str::to_string),
        });
        Self::wait(id, &rx, timeout).map(|_| ())
    }
}

/// The guest side of a job network, for [`GuestLink::net_config`].
pub struct GuestNet<'a> {
    pub mac: &'a str,
    pub ip: std::net::Ipv4Addr,
    pub prefix: u8,
    pub hostname: &'a str,
    pub hosts: &'a [(String, std::net::Ipv4Addr)],
    pub rsh_key: Option<&'a str>,
}

pub struct PendingExec {
    id: u64,
    rx: Receiver<Message>,
}

impl PendingExec {
    /// The request id the guest agent will answer (stable across a migration of the VM).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits up to `timeout`: `None` while the command still runs, so a caller can watch the
    /// VM meanwhile (a dead VM never answers). A streamed command's chunks that arrive
    /// meanwhile go to `on_output` in order (its final result then carries no output).
    pub fn poll(
        &self,
        timeout: Duration,
        on_output: &dyn Fn(OutStream, &str),
    ) -> Result<Option<ExecOutput>, LinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Message::Output { stream, data, .. }) => on_output(stream, &data),
                Ok(Message::Exited {
                    status,
                    stdout,
                    stderr,
                    ..
                }) => {
                    return Ok(Some(ExecOutput {
                        status,
                        stdout,
                        stderr,
                    }));
                }
                Ok(Message::Error { message, .. }) => return Err(LinkError::Agent(message)),
                Ok(other) => return Err(LinkError::Agent(format!("unexpected reply {other:?}"))),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(LinkError::Agent("the guest agent link was closed".into()));
                }
            }
        }
    }

    pub fn wait(self, timeout: Duration) -> Result<ExecOutput, LinkError> {
        match GuestLink::wait(self.id, &self.rx, timeout)? {
            Message::Exited {
                status,
                stdout,
                stderr,
                ..
            } => Ok(ExecOutput {
                status,
                stdout,
                stderr,
            }),
            other => Err(LinkError::Agent(format!("unexpected reply {other:?}"))),
        }
    }
}

impl Drop for GuestLink {
    fn drop(&mut self) {
        // Stops the reader (EOF) and closes every rank's server connection.
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(s) = self
            .inner
            .out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stream
            .take()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for s in self
            .inner
            .ranks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
