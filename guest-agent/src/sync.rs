//! The one rule for poisoned locks in this crate: recover the guard. A thread that panicked
//! while holding a lock leaves data that is still consistent for every use here (maps, queues,
//! counters updated in one step), and refusing it would turn one panic into a hung job.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
