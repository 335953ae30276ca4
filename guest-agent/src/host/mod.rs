//! The host side of the protocol: [`GuestLink`], the one client of a VM's guest agent.
//!
//! A link owns the VM's agent channel for the VM's whole life and multiplexes it: requests
//! (commands, samples, network configuration, power-off) wait for their replies by id on any
//! thread, a streamed command's output arrives while it runs, and the guest ranks' barrier
//! lines are relayed to the controller (one barrier-server connection per guest rank, so the
//! server sees ordinary ranks, or over a [`BarrierRelay`] when the controller is elsewhere).
//! After a live migration [`GuestLink::reattach`] moves the link to the destination's socket;
//! lines sent meanwhile are queued, and the ranks' server connections stay open throughout.

mod fs;
mod inner;
mod pending;
mod user;

pub use pending::PendingExec;

use crate::protocol::{GuestUser, OutStream, PROTOCOL_VERSION, Request};
use inner::{Inner, Reader, encode, lock, read_loop};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    #[error(
        "guest agent speaks protocol {0}, this vse speaks {PROTOCOL_VERSION}; rebuild the image"
    )]
    Version(u32),
    #[error("guest agent gave no reply to request {id} within {waited:?}")]
    Timeout { id: u64, waited: Duration },
    #[error("the guest agent channel closed (the VM stopped)")]
    Closed,
    #[error("gave up waiting for the guest agent (the VM is being stopped)")]
    Cancelled,
    #[error("guest agent: {0}")]
    Agent(String),
}

/// Result of a command run in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Where a link sends the barrier lines of the guest's ranks when the controller is not on
/// this host (a node agent relays them over the job's authenticated overlay). `conn` is the
/// guest agent's id of the rank's connection: it stays the same when the VM migrates, so the
/// controller can answer a rank through whichever node holds the VM by then.
pub trait BarrierRelay: Send + Sync {
    fn up(&self, conn: u64, line: &str);
    fn closed(&self, conn: u64);
}

/// Where the guest ranks' barrier lines go.
#[derive(Clone)]
pub enum Barriers {
    /// Nowhere: a rank that connects sees end-of-file at once and goes on without
    /// coordination (its library's rule when there is no controller).
    None,
    /// The controller's barrier server socket on this host: one connection per rank.
    Socket(PathBuf),
    Relay(Arc<dyn BarrierRelay>),
}

/// How a link connects.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    pub barriers: Barriers,
    /// Longest wait for the socket to appear and the agent to answer (the guest's boot).
    pub timeout: Duration,
    /// Request ids start here, above any id a previous host end of the same guest used (see
    /// [`GuestLink::adopt_exec`]).
    pub first_id: u64,
    /// Set by another thread to stop waiting (the VM is being torn down).
    pub cancel: Option<Arc<AtomicBool>>,
    /// The start of a line the previous host end was cut in at a migration's switchover
    /// ([`GuestLink::detach`] on the source): the destination delivers the rest, and this
    /// link reads the two as one line.
    pub carried: Vec<u8>,
    /// Host directories the guest mounts (asked on every host end it attaches to).
    pub shares: Option<Arc<crate::share::server::ShareSet>>,
}

impl LinkOptions {
    pub fn new(timeout: Duration) -> Self {
        LinkOptions {
            barriers: Barriers::None,
            timeout,
            first_id: 1,
            cancel: None,
            carried: Vec::new(),
            shares: None,
        }
    }

    pub fn shares(mut self, shares: Option<Arc<crate::share::server::ShareSet>>) -> Self {
        self.shares = shares.filter(|s| !s.is_empty());
        self
    }

    pub fn carried(mut self, start: Vec<u8>) -> Self {
        self.carried = start;
        self
    }

    pub fn barriers(mut self, b: Barriers) -> Self {
        self.barriers = b;
        self
    }

    pub fn first_id(mut self, id: u64) -> Self {
        self.first_id = id;
        self
    }

    pub fn cancel(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }

    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
    }
}

pub struct GuestLink {
    inner: Arc<Inner>,
    kernel: Mutex<String>,
}

/// The guest side of a job network, for [`GuestLink::net_config`].
pub struct GuestNet<'a> {
    pub mac: &'a str,
    pub ip: std::net::Ipv4Addr,
    pub prefix: u8,
    pub hostname: &'a str,
    pub hosts: &'a [(String, std::net::Ipv4Addr)],
    pub rsh_key: Option<&'a str>,
    /// Environment of what the rsh service starts.
    pub rsh_env: BTreeMap<String, String>,
    /// Who the rsh service's commands run as (the job's user, or root).
    pub run_as: GuestUser,
}

/// A fresh identity for a guest restored from a boot template, for
/// [`GuestLink::reidentify`].
pub struct GuestIdentity<'a> {
    pub hostname: &'a str,
    /// 32 hex digits.
    pub machine_id: &'a str,
    /// Random bytes from the host (at least 32) for the guest's kernel RNG.
    pub entropy: &'a [u8],
    /// The NIC's MAC, when the VM has one.
    pub mac: Option<&'a str>,
}

impl GuestLink {
    /// Connects to the agent socket of a running VM (waiting for the hypervisor to create it)
    /// and waits for the agent to answer.
    pub fn connect(agent_socket: &Path, opts: &LinkOptions) -> Result<Self, LinkError> {
        Self::connect_then(agent_socket, None, opts, || Ok(()))
    }

    /// [`GuestLink::connect`] to a paused guest: `run` lets it go once this end is connected
    /// and read (so nothing it writes from its first instant on is lost), before the agent is
    /// asked to answer. `channel`: the host end the hypervisor's plugin connected already,
    /// before the guest's state loaded (see `v2m::Vm::take_agent_channel`); without it this
    /// connects to `agent_socket`.
    pub fn connect_then(
        agent_socket: &Path,
        channel: Option<UnixStream>,
        opts: &LinkOptions,
        run: impl FnOnce() -> Result<(), String>,
    ) -> Result<Self, LinkError> {
        let link = Self::new(opts);
        let deadline = Instant::now() + opts.timeout;
        let stream = match channel {
            Some(s) => s,
            None => connect_socket(agent_socket, opts, deadline)?,
        };
        link.attach(stream, agent_socket, opts, deadline, run)?;
        Ok(link)
    }

    /// A link over a channel that is already connected (the hypervisor connected to a socket
    /// this process listens on, or a socket pair in tests).
    pub fn over(stream: UnixStream, opts: &LinkOptions) -> Result<Self, LinkError> {
        let link = Self::new(opts);
        let deadline = Instant::now() + opts.timeout;
        let here = Path::new("(connected channel)");
        link.attach(stream, here, opts, deadline, || Ok(()))?;
        Ok(link)
    }

    fn new(opts: &LinkOptions) -> Self {
        GuestLink {
            inner: Arc::new(Inner::new(
                opts.barriers.clone(),
                opts.first_id,
                opts.shares.clone(),
            )),
            kernel: Mutex::new(String::new()),
        }
    }

    /// Moves the link to another host end of the same guest (the destination of a live
    /// migration: `channel` as in [`GuestLink::connect_then`]), then sends what was queued
    /// meanwhile. A line the old end was cut in is read whole: its start from the old end,
    /// its rest from the new.
    pub fn reattach(
        &self,
        agent_socket: &Path,
        channel: Option<UnixStream>,
    ) -> Result<(), LinkError> {
        let opts = LinkOptions::new(Duration::from_secs(60));
        let deadline = Instant::now() + opts.timeout;
        let stream = match channel {
            Some(s) => s,
            None => connect_socket(agent_socket, &opts, deadline)?,
        };
        self.attach(stream, agent_socket, &opts, deadline, || Ok(()))
    }

    /// Lets go of the host end (the VM's state has moved to another node, whose new link
    /// takes over): reads what the old end still holds, and returns the start of a line it
    /// was cut in, for the new link's [`LinkOptions::carried`].
    pub fn detach(&self) -> Vec<u8> {
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        lock(&self.inner.out).stream = None;
        let cut = match lock(&self.inner.reader).take() {
            Some(r) => r.finish(),
            None => Vec::new(),
        };
        // Share operations this end took are done before the next end takes over: the guest
        // sends them again there, and a late write here must not land after newer ones.
        if let Some(fs) = &self.inner.fs {
            fs.wait_idle(Duration::from_secs(30));
        }
        cut
    }

    /// Makes `stream` the link's host end once the agent answers on it (`run` is called once
    /// the stream is read, before the agent is asked).
    fn attach(
        &self,
        stream: UnixStream,
        path: &Path,
        opts: &LinkOptions,
        deadline: Instant,
        run: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), LinkError> {
        let inner = &self.inner;
        let generation = inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&inner.out).stream = None;
        let err = |source| LinkError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let reader = stream.try_clone().map_err(err)?;
        let shut = stream.try_clone().map_err(err)?;
        let (tx, rx) = channel();
        *lock(&inner.ready) = Some(tx);
        let me = inner.clone();
        // The old end's reader ends (its VM is gone or moved) and hands over the start of a
        // line it was cut in: the new reader reads that first.
        let before = lock(&inner.reader).take();
        let carried = opts.carried.clone();
        let thread = std::thread::spawn(move || {
            let mut start = before.map(Reader::finish).unwrap_or_default();
            start.extend_from_slice(&carried);
            read_loop(me, reader, start, generation)
        });
        *lock(&inner.reader) = Some(Reader {
            stream: shut,
            thread,
        });
        let mut stream = stream;
        if let Err(why) = run() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Err(LinkError::Agent(format!("letting the guest run: {why}")));
        }
        if let Err(e) = self.handshake(&mut stream, &rx, deadline, opts) {
            // Ends this host end's reader too.
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Err(match e {
                LinkError::NotReady { .. } => LinkError::NotReady {
                    path: path.to_path_buf(),
                    waited: opts.timeout,
                },
                other => other,
            });
        }
        let mut out = lock(&inner.out);
        while let Some(line) = out.pending.pop_front() {
            if let Err(source) = stream.write_all(&line) {
                out.pending.push_front(line);
                return Err(err(source));
            }
        }
        out.stream = Some(stream);
        drop(out);
        if self.inner.fs.is_some() {
            // A guest that did not notice the switch would wait long for answers its old
            // end took with it: it sends them again now.
            self.inner.send(&Request::FsResend);
        }
        Ok(())
    }

    /// The shares this link serves (a migration hands them to the destination's link).
    pub fn shares(&self) -> Option<Arc<crate::share::server::ShareSet>> {
        self.inner.fs.as_ref().map(|f| f.set.clone())
    }

    /// Asks the guest to mount the link's shares, once per job: after a cold boot or a boot
    /// template's restore (never before a template is saved, which would hand this job's
    /// mounts to the next). A guest that migrates or is restored from its checkpoint keeps
    /// its mounts in its memory; the host end it comes to only serves them.
    pub fn mount_shares(&self, timeout: Duration) -> Result<(), LinkError> {
        let Some(set) = self.shares() else {
            return Ok(());
        };
        let shares = set.mounts();
        let p = self.request(|id| Request::Mount { id, shares });
        Self::reply(p, timeout)
            .map(|_| ())
            .map_err(|e| LinkError::Agent(format!("mounting the job's shares: {e}")))
    }

    /// A fresh agent session starts with `Ready`. But the guest may not notice that the host
    /// end was swapped (the new end connected before it saw the old one go), and then its
    /// session simply goes on: a reply to a ping proves that just as well.
    fn handshake(
        &self,
        stream: &mut UnixStream,
        ready: &Receiver<Result<String, LinkError>>,
        deadline: Instant,
        opts: &LinkOptions,
    ) -> Result<(), LinkError> {
        let inner = &self.inner;
        loop {
            let ping = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let (ptx, prx) = channel();
            lock(&inner.replies).insert(ping, ptx);
            let _ = stream.write_all(&encode(&Request::Sample { id: ping }));
            let tick = Instant::now() + Duration::from_secs(1);
            let mut alive = false;
            while Instant::now() < tick && !alive {
                if opts.cancelled() {
                    lock(&inner.replies).remove(&ping);
                    return Err(LinkError::Cancelled);
                }
                match ready.try_recv() {
                    Ok(r) => {
                        *lock(&self.kernel) = r?;
                        alive = true;
                    }
                    Err(_) => alive = prx.recv_timeout(Duration::from_millis(20)).is_ok(),
                }
            }
            lock(&inner.replies).remove(&ping);
            if alive {
                // The agent sends `Ready` before it reads the ping: if the ping's reply won,
                // the announcement is already waiting here.
                if let Ok(r) = ready.try_recv() {
                    *lock(&self.kernel) = r?;
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LinkError::NotReady {
                    path: PathBuf::new(),
                    waited: opts.timeout,
                });
            }
        }
    }

    /// Whether a host end is attached (false once the channel closed, until a reattach).
    pub fn attached(&self) -> bool {
        lock(&self.inner.out).stream.is_some()
    }

    /// The guest kernel release the agent announced.
    pub fn kernel(&self) -> String {
        lock(&self.kernel).clone()
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
        let mut replies = lock(&self.inner.replies);
        // What the command sent before it was adopted comes first.
        let mut kept = lock(&self.inner.unclaimed);
        for m in kept.iter().filter(|m| m.id() == Some(id)) {
            let _ = tx.send(m.clone());
        }
        kept.retain(|m| m.id() != Some(id));
        drop(kept);
        replies.insert(id, tx);
        PendingExec { id, rx }
    }

    fn request(&self, make: impl FnOnce(u64) -> Request) -> PendingExec {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        lock(&self.inner.replies).insert(id, tx);
        self.inner.send(&make(id));
        PendingExec { id, rx }
    }

    /// Waits for a reply that is not a command's exit.
    fn reply(p: PendingExec, timeout: Duration) -> Result<crate::protocol::Message, LinkError> {
        use crate::protocol::Message;
        match p.rx.recv_timeout(timeout) {
            Ok(Message::Error { message, .. }) => Err(LinkError::Agent(message)),
            Ok(m) => Ok(m),
            Err(_) => Err(LinkError::Timeout {
                id: p.id,
                waited: timeout,
            }),
        }
    }

    /// The guest's own `/proc/meminfo` and `/proc/stat` (seed 000 §IV-A: it disagrees with
    /// the host's view of the hypervisor process, and both are needed).
    pub fn sample(&self, timeout: Duration) -> Result<(String, String), LinkError> {
        use crate::protocol::Message;
        match Self::reply(self.request(|id| Request::Sample { id }), timeout)? {
            Message::Sample { meminfo, stat, .. } => Ok((meminfo, stat)),
            other => Err(LinkError::Agent(format!("unexpected reply {other:?}"))),
        }
    }

    /// Asks the guest to sync its disks and power off.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), LinkError> {
        Self::reply(self.request(|id| Request::Shutdown { id }), timeout).map(|_| ())
    }

    /// Configures the guest's job NIC (found by MAC), hostname and `/etc/hosts`, and with
    /// `rsh_key` the guest's rsh service for mpirun.
    pub fn net_config(&self, cfg: GuestNet<'_>, timeout: Duration) -> Result<(), LinkError> {
        let p = self.request(|id| Request::NetConfig {
            id,
            mac: cfg.mac.into(),
            ip: cfg.ip,
            prefix: cfg.prefix,
            hostname: cfg.hostname.into(),
            hosts: cfg.hosts.to_vec(),
            rsh_key: cfg.rsh_key.map(str::to_string),
            rsh_env: cfg.rsh_env,
            rsh_user: cfg.rsh_key.is_some().then_some(cfg.run_as),
        });
        Self::reply(p, timeout).map(|_| ())
    }

    /// Gives a guest restored from a saved state its own identity: random state, machine id,
    /// hostname, the host's clock now and the NIC's MAC (see `Request::Reidentify`).
    pub fn reidentify(&self, id: GuestIdentity<'_>, timeout: Duration) -> Result<(), LinkError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let p = self.request(|rid| Request::Reidentify {
            id: rid,
            hostname: id.hostname.into(),
            machine_id: id.machine_id.into(),
            entropy: id.entropy.iter().map(|b| format!("{b:02x}")).collect(),
            time_unix_ns: now,
            mac: id.mac.map(str::to_string),
        });
        Self::reply(p, timeout).map(|_| ())
    }

    /// Starts `argv` in the guest; the reply arrives on [`PendingExec::wait`], even if the VM
    /// migrates meanwhile.
    pub fn spawn(&self, argv: &[&str], env: BTreeMap<String, String>) -> PendingExec {
        self.start(argv, env, false, None, GuestUser::current())
    }

    /// Like [`GuestLink::spawn`], but the guest sends the output while the command runs:
    /// [`PendingExec::poll`] hands each chunk over as it arrives.
    pub fn spawn_stream(&self, argv: &[&str], env: BTreeMap<String, String>) -> PendingExec {
        self.start(argv, env, true, None, GuestUser::current())
    }

    /// [`GuestLink::spawn_stream`] as `user` (the others run as this process's user) in
    /// `cwd` (default: the user's home); with `stdin`, its standard input comes in
    /// [`GuestLink::send_stdin`] chunks.
    pub fn spawn_stream_as(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        user: GuestUser,
        cwd: Option<String>,
        stdin: bool,
    ) -> PendingExec {
        self.begin(argv, env, true, cwd, user, stdin)
    }

    /// [`GuestLink::spawn_stream`] as `user` in `cwd` (default: the user's home), its
    /// standard input streamed from `input` until that ends (see [`GuestLink::feed_stdin`]).
    pub fn spawn_stream_with_input(
        self: &Arc<Self>,
        argv: &[&str],
        env: BTreeMap<String, String>,
        user: GuestUser,
        cwd: Option<String>,
        input: impl std::io::Read + Send + 'static,
    ) -> PendingExec {
        let p = self.begin(argv, env, true, cwd, user, true);
        self.feed_stdin(p.id(), input);
        p
    }

    /// Streams `input` to the standard input of command `exec` (started with its input
    /// streamed), on a thread of its own, one acknowledged chunk at a time: a command that
    /// stops reading holds the thread, never the guest's memory. End of `input` closes the
    /// command's input; the thread ends then, when the command no longer reads, or when the
    /// link closes for good.
    pub fn feed_stdin(self: &Arc<Self>, exec: u64, mut input: impl std::io::Read + Send + 'static) {
        let link = self.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; STDIN_CHUNK];
            let mut offset = 0u64;
            loop {
                let n = crate::protocol::read_chunk(&mut input, &mut buf);
                if link.send_stdin(exec, offset, &buf[..n], n == 0).is_err() {
                    return;
                }
                if n == 0 {
                    return;
                }
                offset += n as u64;
            }
        });
    }

    /// Writes one chunk of command `exec`'s standard input (from byte `offset`; `eof` ends the
    /// input) and waits for the guest to have written it, for as long as the link is open (a
    /// command may take its time to read).
    pub fn send_stdin(
        &self,
        exec: u64,
        offset: u64,
        data: &[u8],
        eof: bool,
    ) -> Result<(), LinkError> {
        use crate::protocol::Message;
        let p = self.request(|id| Request::Stdin {
            id,
            exec,
            offset,
            data: crate::protocol::hex(data),
            eof,
        });
        loop {
            match p.rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Message::Error { message, .. }) => return Err(LinkError::Agent(message)),
                Ok(_) => return Ok(()),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if self.attached() => {}
                Err(_) => return Err(LinkError::Closed),
            }
        }
    }

    fn start(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        stream: bool,
        cwd: Option<String>,
        user: GuestUser,
    ) -> PendingExec {
        self.begin(argv, env, stream, cwd, user, false)
    }

    fn begin(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        stream: bool,
        cwd: Option<String>,
        user: GuestUser,
        stdin_stream: bool,
    ) -> PendingExec {
        let argv = argv.iter().map(|s| s.to_string()).collect();
        let user = Some(user);
        self.request(|id| {
            let stdin = None;
            if stream {
                Request::ExecStream {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                    user,
                    stdin_stream,
                }
            } else {
                Request::Exec {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                    user,
                    stdin_stream,
                }
            }
        })
    }

    /// Runs `argv` and waits up to `timeout` for its whole output.
    pub fn exec(&self, argv: &[&str], timeout: Duration) -> Result<ExecOutput, LinkError> {
        self.spawn(argv, BTreeMap::new()).wait(timeout)
    }

    /// Runs `argv` with `env`, handing its output to `on_output` while it runs, until it
    /// exits or the channel closes; returns the exit status. An agent from before streaming
    /// existed gets a plain `exec`, and its whole output arrives at the end.
    pub fn run(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<i32, LinkError> {
        self.run_as(argv, env, GuestUser::current(), on_output)
    }

    /// [`GuestLink::run`] as `user`.
    pub fn run_as(
        &self,
        argv: &[&str],
        env: BTreeMap<String, String>,
        user: GuestUser,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<i32, LinkError> {
        let streamed = self.start(argv, env.clone(), true, None, user.clone());
        self.run_to_end(streamed, argv, env, user, on_output)
    }

    /// [`GuestLink::run_as`], the command's standard input streamed from `input` (an agent
    /// from before streamed input gives the command none).
    pub fn run_with_input(
        self: &Arc<Self>,
        argv: &[&str],
        env: BTreeMap<String, String>,
        user: GuestUser,
        cwd: Option<String>,
        input: impl std::io::Read + Send + 'static,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<i32, LinkError> {
        let streamed = self.spawn_stream_with_input(argv, env.clone(), user.clone(), cwd, input);
        self.run_to_end(streamed, argv, env, user, on_output)
    }

    fn run_to_end(
        &self,
        streamed: PendingExec,
        argv: &[&str],
        env: BTreeMap<String, String>,
        user: GuestUser,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<i32, LinkError> {
        let out = match self.finish(&streamed, on_output) {
            Err(LinkError::Agent(m)) if m.contains("exec-stream") => {
                self.finish(&self.start(argv, env, false, None, user), on_output)?
            }
            r => r?,
        };
        for (s, d) in [
            (OutStream::Stdout, out.stdout),
            (OutStream::Stderr, out.stderr),
        ] {
            if !d.is_empty() {
                on_output(s, &d);
            }
        }
        Ok(out.status)
    }

    /// Waits for `p` for as long as the channel is open: a command may stay silent for as
    /// long as it likes, and a VM that stops closes the channel.
    fn finish(
        &self,
        p: &PendingExec,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<ExecOutput, LinkError> {
        loop {
            if let Some(out) = p.poll(Duration::from_millis(200), on_output)? {
                return Ok(out);
            }
            if !self.attached() {
                // What the guest sent before the channel closed is still queued.
                return p.poll(Duration::ZERO, on_output)?.ok_or(LinkError::Closed);
            }
        }
    }
}

/// Bytes of standard input per `Stdin` request (twice that as hex on the channel).
const STDIN_CHUNK: usize = 32 * 1024;

/// Connects to a socket the hypervisor creates while it starts: waits for it rather than
/// fail at once.
fn connect_socket(
    path: &Path,
    opts: &LinkOptions,
    deadline: Instant,
) -> Result<UnixStream, LinkError> {
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(source) if Instant::now() >= deadline => {
                return Err(LinkError::Connect {
                    path: path.to_path_buf(),
                    source,
                });
            }
            Err(_) if opts.cancelled() => return Err(LinkError::Cancelled),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl Drop for GuestLink {
    fn drop(&mut self) {
        // Stops the reader (EOF) and closes every rank's server connection.
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(s) = lock(&self.inner.out).stream.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(r) = lock(&self.inner.reader).take() {
            let _ = r.stream.shutdown(std::net::Shutdown::Both);
        }
        for s in lock(&self.inner.ranks).values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, OutStream, PROTOCOL_VERSION};
    use std::io::Write;

    /// A new link (a restored or migrated VM's) may hear a command an earlier link started
    /// before it adopts it: nothing the command sent meanwhile is lost, and nothing of this
    /// link's own traffic is kept.
    #[test]
    fn what_an_earlier_links_command_sent_before_its_adoption_is_handed_to_the_adopter() {
        let (host, mut guest) = UnixStream::pair().unwrap();
        let line = |m: &Message| {
            let mut l = serde_json::to_vec(m).unwrap();
            l.push(b'\n');
            l
        };
        let ready = Message::Ready {
            version: PROTOCOL_VERSION,
            kernel: "test".into(),
        };
        guest.write_all(&line(&ready)).unwrap();
        let link =
            GuestLink::over(host, &LinkOptions::new(Duration::from_secs(5)).first_id(10)).unwrap();
        let out = |id, data: &str| Message::Output {
            id,
            stream: OutStream::Stdout,
            data: data.into(),
        };
        for m in [
            out(5, "one\n"),
            out(12, "not an earlier link's\n"),
            out(5, "two\n"),
            Message::Exited {
                id: 5,
                status: 3,
                stdout: String::new(),
                stderr: String::new(),
            },
        ] {
            guest.write_all(&line(&m)).unwrap();
        }
        // The reader thread has them all once the last is kept.
        let until = Instant::now() + Duration::from_secs(5);
        while lock(&link.inner.unclaimed).len() < 3 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(lock(&link.inner.unclaimed).len(), 3);
        let mut seen = String::new();
        let end = link
            .adopt_exec(5)
            .poll(Duration::from_secs(5), &mut |_, d| seen.push_str(d))
            .unwrap()
            .expect("the command's exit, kept");
        assert_eq!(seen, "one\ntwo\n");
        assert_eq!(end.status, 3);
        assert!(lock(&link.inner.unclaimed).is_empty());
    }

    fn line(m: &Message) -> Vec<u8> {
        let mut l = serde_json::to_vec(m).unwrap();
        l.push(b'\n');
        l
    }

    fn ready() -> Vec<u8> {
        line(&Message::Ready {
            version: PROTOCOL_VERSION,
            kernel: "test".into(),
        })
    }

    /// A command's output line and exit, the line split at `at`.
    fn cut_line(at: usize) -> (Vec<u8>, Vec<u8>) {
        let mut all = line(&Message::Output {
            id: 5,
            stream: OutStream::Stdout,
            data: "x".repeat(1000),
        });
        all.extend(line(&Message::Exited {
            id: 5,
            status: 0,
            stdout: String::new(),
            stderr: String::new(),
        }));
        let rest = all.split_off(at);
        (all, rest)
    }

    fn adopted_output(link: &GuestLink) -> String {
        let mut seen = String::new();
        let end = link
            .adopt_exec(5)
            .poll(Duration::from_secs(5), &mut |_, d| seen.push_str(d))
            .unwrap()
            .expect("the command's exit");
        assert_eq!(end.status, 0);
        seen
    }

    /// A migration's switchover can fall inside a line: the source's end has its start, the
    /// destination's the rest. Moving the link within this process, the line is read whole,
    /// also when the source's hypervisor quits with our requests unread (which resets the
    /// socket after what it wrote).
    #[test]
    fn a_line_cut_at_a_reattach_is_read_whole_even_after_a_reset() {
        let (host, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(&ready()).unwrap();
        let link =
            GuestLink::over(host, &LinkOptions::new(Duration::from_secs(5)).first_id(10)).unwrap();
        let (start, rest) = cut_line(400);
        guest.write_all(&start).unwrap();
        // The handshake's pings lie unread in `guest`: closing it resets the socket.
        drop(guest);
        let (host, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(&rest).unwrap();
        guest.write_all(&ready()).unwrap();
        link.reattach(Path::new("(test)"), Some(host)).unwrap();
        assert_eq!(adopted_output(&link), "x".repeat(1000));
    }

    /// Across node agents: the source's link hands the start over ([`GuestLink::detach`]),
    /// and the destination's new link reads it before the rest.
    #[test]
    fn a_line_cut_at_a_move_between_processes_is_carried_to_the_new_link() {
        let (host, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(&ready()).unwrap();
        let old = GuestLink::over(host, &LinkOptions::new(Duration::from_secs(5))).unwrap();
        let (start, rest) = cut_line(250);
        guest.write_all(&start).unwrap();
        let carried = old.detach();
        assert_eq!(carried, start);
        let (host, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(&rest).unwrap();
        guest.write_all(&ready()).unwrap();
        let opts = LinkOptions::new(Duration::from_secs(5))
            .first_id(10)
            .carried(carried);
        let new = GuestLink::over(host, &opts).unwrap();
        assert_eq!(adopted_output(&new), "x".repeat(1000));
    }
}
