//! Reaping for PID 1. The kernel hands every orphan in the VM to PID 1, and nobody else will
//! ever wait for them: without a reaper they stay zombies until power-off. Once installed,
//! one thread reaps every child of this process and hands the statuses of the agent's own
//! commands (started through [`spawn`]) to their waiters; the rest are orphans and dropped.
//!
//! Why peek, then reap everything under the spawn lock (rather than reaping only pids that
//! are not registered and leaving ours to `Child::wait`):
//! - a peek (`waitid` with `WNOWAIT`) reports one zombie at a time: a command of ours whose
//!   waiter is still reading its output would hide every orphan behind it, or make the
//!   thread spin on it;
//! - a command can exit before `spawn` has told us its pid. Reaping happens only while no
//!   spawn is in progress, and a spawn registers its pid before releasing the lock, so every
//!   pid reaped is either registered or an orphan, never "ours, not known yet";
//! - std's `spawn` itself waits for a child whose exec failed (and panics if that child was
//!   reaped from under it); the lock covers that wait too.
//!
//! Without [`install`] (not PID 1: the host, unit tests) [`spawn`] and [`Spawned::wait`] are
//! `Command::spawn` and `Child::wait`.

use crate::sync::lock;
use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

#[derive(Default)]
struct Slot {
    status: Mutex<Option<i32>>,
    done: Condvar,
}

#[derive(Default)]
struct Registry {
    /// The agent's own commands not reaped yet, by pid.
    waiting: HashMap<i32, Arc<Slot>>,
    /// Counts spawns, so a reaper without children knows when to look again.
    spawns: u64,
}

#[derive(Default)]
struct Reaper {
    registry: Mutex<Registry>,
    spawned: Condvar,
}

static REAPER: OnceLock<Arc<Reaper>> = OnceLock::new();

/// Starts the reaper thread (once per process). Call it as PID 1 or as a child subreaper
/// (`PR_SET_CHILD_SUBREAPER`), before anything is spawned: from then on every child of this
/// process is reaped by it, so nothing else may call `wait` on children.
pub fn install() -> io::Result<()> {
    if REAPER.get().is_some() {
        return Ok(());
    }
    let r = Arc::new(Reaper::default());
    if REAPER.set(r.clone()).is_err() {
        return Ok(()); // installed concurrently
    }
    std::thread::Builder::new()
        .name("vse-reaper".into())
        .spawn(move || r.run())?;
    Ok(())
}

/// A child started by [`spawn`]: its pipes are in `child`; wait for it with [`Self::wait`].
pub struct Spawned {
    pub child: Child,
    slot: Option<Arc<Slot>>,
}

impl Spawned {
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        let Some(slot) = &self.slot else {
            return self.child.wait();
        };
        let mut st = lock(&slot.status);
        loop {
            if let Some(raw) = *st {
                return Ok(ExitStatus::from_raw(raw));
            }
            st = slot.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// `cmd.spawn()`, registered with the reaper when there is one.
pub fn spawn(cmd: &mut Command) -> io::Result<Spawned> {
    let Some(r) = REAPER.get() else {
        return Ok(Spawned {
            child: cmd.spawn()?,
            slot: None,
        });
    };
    let mut reg = lock(&r.registry);
    let child = cmd.spawn()?;
    let slot = Arc::new(Slot::default());
    reg.waiting.insert(child.id() as i32, slot.clone());
    reg.spawns += 1;
    r.spawned.notify_all();
    Ok(Spawned {
        child,
        slot: Some(slot),
    })
}

/// `waitid(P_ALL, WEXITED | WNOWAIT | flags)`: Ok when a child has exited (it stays a
/// zombie), or with `WNOHANG`, when there are children at all.
fn peek(flags: i32) -> io::Result<()> {
    // SAFETY: an all-zero siginfo_t is valid; waitid only writes into it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let opts = libc::WEXITED | libc::WNOWAIT | libc::__WALL | flags;
    // SAFETY: `info` is a valid, writable siginfo_t.
    if unsafe { libc::waitid(libc::P_ALL, 0, &mut info, opts) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Reaper {
    fn run(&self) {
        loop {
            match peek(0) {
                Ok(()) => self.reap_all(),
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => self.await_child(),
                Err(_) => {} // interrupted
            }
        }
    }

    fn reap_all(&self) {
        let mut reg = lock(&self.registry);
        loop {
            let mut raw = 0;
            // SAFETY: plain syscall writing into `raw`.
            let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG | libc::__WALL) };
            if pid <= 0 {
                return;
            }
            if let Some(slot) = reg.waiting.remove(&pid) {
                *lock(&slot.status) = Some(raw);
                slot.done.notify_all();
            }
        }
    }

    /// No children: orphans only come from descendants, so nothing can change before the next
    /// spawn. Checked under the lock, which every spawn takes.
    fn await_child(&self) {
        let mut reg = lock(&self.registry);
        let seen = reg.spawns;
        while reg.spawns == seen && peek(libc::WNOHANG).is_err() {
            reg = self.spawned.wait(reg).unwrap_or_else(|e| e.into_inner());
        }
    }
}
