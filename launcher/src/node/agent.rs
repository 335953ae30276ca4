//! A node agent process: the agent runtime with a [`NodeService`] acting on its events.

use super::{NodeService, NodeState};
use crate::wire::Wire;
use agents::agent::{AgentConfig, AgentError, Event, Exit, run_node_blocking};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Runs this node's agent until the job ends, handing every event to `log` before the node
/// acts on it. Whatever ended the agent, no VM it started outlives it.
pub fn run_node_agent(
    cfg: AgentConfig,
    parent: SocketAddr,
    mut log: impl FnMut(&Event<Wire>) + Send,
) -> Result<Exit, AgentError> {
    // A batch system ending the job signals every process of it at once; the node agent must
    // stay for the front-end's checkpoint (its VMs pause on the same signal). It still ends
    // with the front-end, which it watches, and with the batch system's SIGKILL.
    let mut service = NodeService::new(cfg.id, cfg.bind, cfg.secret.clone());
    on_sigterm(service.state());
    let exit = run_node_blocking(cfg, parent, |e, h| {
        log(e);
        service.on_event(e, h);
    });
    service.teardown();
    exit
}

/// How long after the batch system's SIGTERM the node waits for the front-end's checkpoint
/// before it ends its VMs itself: well inside Slurm's `KillWait` (30 s by default), after
/// which SIGKILL would leave their run directories and disk overlays behind.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// The write end of the pipe the SIGTERM handler wakes the watcher through.
static TERM_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn note_sigterm(_: libc::c_int) {
    let fd = TERM_PIPE.load(Ordering::SeqCst);
    // SAFETY: write(2) on a pipe is async-signal-safe; the byte is a static.
    unsafe { libc::write(fd, b"t".as_ptr().cast(), 1) };
}

/// On SIGTERM (`scancel`, a time limit, preemption), unless the front-end starts a checkpoint
/// within [`TERM_GRACE`], stops every VM of the node, which removes their files.
fn on_sigterm(state: Arc<NodeState>) {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!(
            "vse agent: no pipe for SIGTERM: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    TERM_PIPE.store(fds[1], Ordering::SeqCst);
    let handler = note_sigterm as extern "C" fn(libc::c_int) as *const () as libc::sighandler_t;
    // SAFETY: the handler only writes a byte to a pipe, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, handler) };
    // SAFETY: fds[0] is the read end just made, owned from here on by this File.
    let mut wake = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        if std::io::Read::read(&mut wake, &mut b).unwrap_or(0) == 0 {
            return;
        }
        let end = Instant::now() + TERM_GRACE;
        while Instant::now() < end {
            if state.is_checkpointing() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("vse agent: terminated by the batch system, no checkpoint: stopping its VMs");
        drop(state.stop_all());
    });
}
