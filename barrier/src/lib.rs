//! Barrier hook for applications running in vse VMs (seed 002 §3). A rank calls
//! [`vse_barrier_check`] at each barrier (MPI programs get it for free from the
//! `MPI_Barrier` PMPI wrapper in `c/mpi_barrier.c`); when the controller has posted a
//! migration notice for this rank's VM the call blocks until the VM has moved.

mod client;

pub use client::{BarrierError, Check, Client};

use std::ffi::{CString, c_char, c_int, c_ulong};
use std::sync::Mutex;

pub const GO: c_int = 0;
pub const MIGRATED: c_int = 1;
pub const RELEASED: c_int = 2;
pub const INACTIVE: c_int = 3;
pub const ERROR: c_int = -1;

enum Slot {
    Unset,
    Inactive,
    Active(Client),
    Failed,
}

struct Global {
    slot: Slot,
    checks: u64,
    migrations: u64,
    error: Option<CString>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    slot: Slot::Unset,
    checks: 0,
    migrations: 0,
    error: None,
});

fn with<T>(f: impl FnOnce(&mut Global) -> T) -> T {
    // A panic never crosses the C boundary: a poisoned lock is still usable data.
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g)
}

fn set_error(g: &mut Global, e: &BarrierError) {
    g.error = CString::new(e.to_string().replace('\0', " ")).ok();
}

fn init(g: &mut Global) -> c_int {
    match &g.slot {
        Slot::Active(_) => return GO,
        Slot::Inactive => return INACTIVE,
        Slot::Failed => return ERROR,
        Slot::Unset => {}
    }
    match Client::from_env() {
        Ok(Some(c)) => {
            g.slot = Slot::Active(c);
            GO
        }
        Ok(None) => {
            g.slot = Slot::Inactive;
            INACTIVE
        }
        Err(e) => {
            set_error(g, &e);
            g.slot = Slot::Failed;
            ERROR
        }
    }
}

/// Connects to the barrier channel described by the environment.
#[unsafe(no_mangle)]
pub extern "C" fn vse_barrier_init() -> c_int {
    with(init)
}

/// The barrier hook; see `include/vse_barrier.h` for the return codes.
#[unsafe(no_mangle)]
pub extern "C" fn vse_barrier_check() -> c_int {
    with(|g| {
        let rc = init(g);
        if rc != GO {
            return rc;
        }
        g.checks += 1;
        let Slot::Active(client) = &mut g.slot else {
            return ERROR;
        };
        match client.check() {
            Ok(Check::Go) => GO,
            Ok(Check::Migrated) => {
                g.migrations += 1;
                MIGRATED
            }
            Ok(Check::Released) => RELEASED,
            Err(e) => {
                set_error(g, &e);
                g.slot = Slot::Failed;
                ERROR
            }
        }
    })
}

/// Writes the number of checks and of migrations so far; null pointers are skipped.
///
/// # Safety
/// Non-null pointers must be valid for writing one `unsigned long`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vse_barrier_stats(checks: *mut c_ulong, migrations: *mut c_ulong) {
    let (c, m) = with(|g| (g.checks, g.migrations));
    // SAFETY: the caller guarantees non-null pointers are writable.
    unsafe {
        if !checks.is_null() {
            *checks = c as c_ulong;
        }
        if !migrations.is_null() {
            *migrations = m as c_ulong;
        }
    }
}

/// The last error message, or null. The pointer stays valid until the next call into the
/// library from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn vse_barrier_last_error() -> *const c_char {
    with(|g| g.error.as_ref().map_or(std::ptr::null(), |e| e.as_ptr()))
}

/// Closes the channel (the controller then stops counting this rank).
#[unsafe(no_mangle)]
pub extern "C" fn vse_barrier_finalize() {
    with(|g| g.slot = Slot::Unset);
}
