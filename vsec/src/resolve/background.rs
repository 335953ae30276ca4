//! Writing the index cache after `vse lock` has answered: a cold lock parses the indices
//! anyway, and the user should not wait another 0.1-0.2 s for the cache file that only later
//! runs use. The process forks and the writer, with a copy-on-write view of the parsed
//! universe, writes the file and exits; the file appears by rename once complete, as when
//! written in place.

use super::cached::{IndexCacheNote, PendingCache};
use crate::solve::Catalog;

/// A cache file still to write and the universe it is written from.
pub struct DeferredCache {
    pub universe: Box<dyn Catalog>,
    pub pending: PendingCache,
}

impl std::fmt::Debug for DeferredCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredCache")
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl DeferredCache {
    /// Writes the cache file in a process of its own and returns at once; writes it here
    /// when this process has other threads (a fork would copy only this one, and the locks
    /// the others hold). For a process about to end: the universe is not freed (freeing
    /// millions of allocations after a fork would copy every page it touches).
    pub fn finish_in_background(self) -> IndexCacheNote {
        let DeferredCache { universe, pending } = self;
        let Some(u) = universe.parsed() else {
            return IndexCacheNote::Off {
                reason: "nothing was parsed to write".into(),
            };
        };
        let note = if single_threaded() && fork_writer(&pending, u) {
            pending.building()
        } else {
            pending.write(u)
        };
        std::mem::forget(universe);
        note
    }
}

fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().eq(["Threads:", "1"]))
    })
}

/// Forks a detached writer; false when it could not (the caller writes the file itself).
/// The writer is not waited for: this process ends first, and init reaps it.
fn fork_writer(pending: &PendingCache, u: &crate::solve::Universe) -> bool {
    // SAFETY: this process has one thread (checked), so the child's copy is consistent.
    match unsafe { libc::fork() } {
        -1 => false,
        0 => {
            // SAFETY: setsid in the single-threaded child: no terminal signal of the
            // parent's session reaches the writer.
            unsafe { libc::setsid() };
            quiet_stdio();
            let _ = pending.write(u);
            // SAFETY: ends the writer without running this process's exit handlers or
            // flushing buffers it shares with the parent.
            unsafe { libc::_exit(0) }
        }
        _ => true,
    }
}

/// The writer's standard streams go nowhere: whoever reads this process's output sees its
/// end when this process ends, not when the writer does.
fn quiet_stdio() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of this (single-threaded) writer.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}
