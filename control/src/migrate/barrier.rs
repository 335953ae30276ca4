//! Controller side of the barrier channel (seed 002 §3 step 2), without the papers' polling
//! of a shared file on every barrier: the notice is *pushed* to each rank's connection, and a
//! rank's barrier hook only does one non-blocking read to see whether a notice arrived.
//!
//! Line protocol (the guest agent relays it between the guest socket and the controller):
//! rank → `HELLO <job> <vm> <rank>`, controller → `NOTICE <id>`, rank at its next barrier →
//! `READY <id>`, controller after the migration → `ACK <id> migrated|cancelled|failed`.
//! A job checkpoint holds the ranks the same way (`ACK <id> checkpointed`); a notice is only
//! posted to VMs no other notice holds, so a migration and a checkpoint never mix.

use crate::sync::lock;
use monitor::{JobId, VmId};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How a notice ended, as told to the blocked ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    Migrated,
    Cancelled,
    Failed,
    /// The job was checkpointed while the ranks waited.
    Checkpointed,
}

impl AckOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Migrated => "migrated",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
            Self::Checkpointed => "checkpointed",
        }
    }
}

/// The line that releases a rank blocked at the barrier for notice `id`: what a restored
/// job's blocked ranks are sent, since the server that posted the notice is gone.
pub fn ack_line(id: i64, outcome: AckOutcome) -> String {
    format!("ACK {id} {}", outcome.as_str())
}

/// The first line of a rank's connection: who it is.
pub fn hello_line(job: &JobId, vm: &VmId, rank: u32) -> String {
    format!("HELLO {job} {vm} {rank}")
}

/// A rank's `HELLO` line, or `None` when `line` is not one.
pub fn parse_hello(line: &str) -> Option<(JobId, VmId, u32)> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["HELLO", job, vm, rank] => JobId::new(*job)
            .ok()
            .zip(VmId::new(*vm).ok())
            .zip(rank.parse::<u32>().ok())
            .map(|((j, v), r)| (j, v, r)),
        _ => None,
    }
}

struct Conn {
    job: JobId,
    vm: VmId,
    rank: u32,
    out: UnixStream,
    ready_for: Option<i64>,
}

#[derive(Default)]
struct State {
    conns: HashMap<u64, Conn>,
    notices: HashMap<VmId, i64>,
    next: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

/// The listening side. Dropping it closes every connection, so ranks blocked at a barrier
/// see end-of-file and go on instead of hanging on a dead controller.
pub struct BarrierServer {
    path: PathBuf,
    shared: Arc<Shared>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

fn send(out: &mut UnixStream, line: &str) {
    // A rank that vanished is noticed by its reader thread; nothing to do here.
    let _ = out.write_all(line.as_bytes());
}

impl BarrierServer {
    pub fn bind(path: &Path) -> Result<Self, BarrierError> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| BarrierError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let acceptor = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if sh.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let sh = sh.clone();
                std::thread::spawn(move || serve(sh, stream));
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ranks connected now, per VM.
    pub fn ranks(&self, job: &JobId) -> HashMap<VmId, Vec<u32>> {
        let st = lock(&self.shared.state);
        let mut out: HashMap<VmId, Vec<u32>> = HashMap::new();
        for c in st.conns.values().filter(|c| &c.job == job) {
            out.entry(c.vm.clone()).or_default().push(c.rank);
        }
        out
    }

    /// Step 1a: tells every rank on the affected VMs (and any that connect later). A VM
    /// another notice holds is left out (it never becomes ready for this one).
    pub fn post_notice(&self, id: i64, vms: &[VmId]) {
        let mut st = lock(&self.shared.state);
        let free: Vec<VmId> = (vms.iter())
            .filter(|vm| st.notices.get(*vm).is_none_or(|n| *n == id))
            .cloned()
            .collect();
        Self::notify(&mut st, id, &free);
    }

    /// Posts notice `id` to all of `vms`, or to none when another notice holds any of them.
    pub fn try_post_notice(&self, id: i64, vms: &[VmId]) -> bool {
        let mut st = lock(&self.shared.state);
        if vms.iter().any(|vm| st.notices.contains_key(vm)) {
            return false;
        }
        Self::notify(&mut st, id, vms);
        true
    }

    fn notify(st: &mut State, id: i64, vms: &[VmId]) {
        for vm in vms {
            st.notices.insert(vm.clone(), id);
        }
        for c in st.conns.values_mut().filter(|c| vms.contains(&c.vm)) {
            send(&mut c.out, &format!("NOTICE {id}\n"));
        }
    }

    /// Step 2: waits until every VM has at least one connected rank and all its ranks are
    /// blocked at a barrier for `id`, or until `deadline`. Returns the VMs that are ready.
    pub fn wait_ready(&self, id: i64, vms: &[VmId], deadline: Instant) -> Vec<VmId> {
        let mut st = lock(&self.shared.state);
        loop {
            let ready: Vec<VmId> = vms
                .iter()
                .filter(|vm| {
                    let mut ranks = st.conns.values().filter(|c| &c.vm == *vm).peekable();
                    ranks.peek().is_some() && ranks.all(|c| c.ready_for == Some(id))
                })
                .cloned()
                .collect();
            let now = Instant::now();
            if ready.len() == vms.len() || now >= deadline {
                return ready;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Step 4: releases the blocked ranks and withdraws the notice. Ranks that never reached
    /// the barrier get the ACK too, so their next barrier does not block on a stale notice.
    pub fn ack(&self, id: i64, outcome: AckOutcome) {
        let mut st = lock(&self.shared.state);
        let vms: Vec<VmId> = st
            .notices
            .iter()
            .filter(|(_, n)| **n == id)
            .map(|(vm, _)| vm.clone())
            .collect();
        for vm in &vms {
            st.notices.remove(vm);
        }
        for c in st.conns.values_mut().filter(|c| vms.contains(&c.vm)) {
            c.ready_for = None;
            send(&mut c.out, &format!("{}\n", ack_line(id, outcome)));
        }
    }
}

fn serve(sh: Arc<Shared>, stream: UnixStream) {
    let Ok(out) = stream.try_clone() else { return };
    let mut lines = BufReader::new(stream).lines();
    let Some(Ok(hello)) = lines.next() else {
        return;
    };
    let Some((job, vm, rank)) = parse_hello(&hello) else {
        let mut out = out;
        send(&mut out, "ERR expected `HELLO <job> <vm> <rank>`\n");
        return;
    };
    let key = {
        let mut st = lock(&sh.state);
        let key = st.next;
        st.next += 1;
        let mut out = out;
        if let Some(id) = st.notices.get(&vm) {
            send(&mut out, &format!("NOTICE {id}\n"));
        }
        st.conns.insert(
            key,
            Conn {
                job,
                vm,
                rank,
                out,
                ready_for: None,
            },
        );
        sh.changed.notify_all();
        key
    };
    for line in lines {
        let Ok(line) = line else { break };
        if let Some(id) = line
            .strip_prefix("READY ")
            .and_then(|s| s.trim().parse().ok())
        {
            let mut st = lock(&sh.state);
            let vm = st.conns.get(&key).map(|c| c.vm.clone());
            let current = vm.and_then(|vm| st.notices.get(&vm).copied());
            if let Some(c) = st.conns.get_mut(&key) {
                if current == Some(id) {
                    c.ready_for = Some(id);
                } else {
                    // A READY for a notice already withdrawn: release the rank at once.
                    send(&mut c.out, &format!("ACK {id} cancelled\n"));
                }
            }
            sh.changed.notify_all();
        }
    }
    let mut st = lock(&sh.state);
    st.conns.remove(&key);
    sh.changed.notify_all();
}

impl Drop for BarrierServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let st = lock(&self.shared.state);
        for c in st.conns.values() {
            let _ = c.out.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
