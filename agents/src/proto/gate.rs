//! Admission to a listener before authentication: at most [`MAX_UNAUTHENTICATED`]
//! connections are in their handshake at once (a stranger opening connections that never
//! speak fills a bounded set of slots, each freed at the handshake deadline, not the node's
//! memory or descriptors), and an accept that fails for lack of descriptors or memory waits
//! before the next try instead of spinning on a connection the kernel keeps offering.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections between accept and a finished handshake, per listener.
pub const MAX_UNAUTHENTICATED: usize = 64;

/// First and longest wait after an accept failed for want of resources.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One listener's admission: the slots of unauthenticated connections, and a count of the
/// accepts that failed (for tests and logs).
#[derive(Clone)]
pub struct Gate {
    slots: Arc<Semaphore>,
    pub errors: Arc<AtomicU64>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(MAX_UNAUTHENTICATED)
    }
}

impl Gate {
    pub fn new(slots: usize) -> Self {
        Gate {
            slots: Arc::new(Semaphore::new(slots)),
            errors: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The next connection, with the slot it holds until its handshake is done (drop the
    /// permit then). Waits while every slot is taken.
    pub async fn accept(
        &self,
        listener: &TcpListener,
    ) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                // Never closed; wait rather than spin if it ever were.
                std::future::pending::<()>().await;
                unreachable!();
            };
            match listener.accept().await {
                Ok((s, peer)) => return (s, peer, permit),
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    if starved(&e) {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
            }
        }
    }
}

/// Errors that last until something else frees resources: retrying at once only spins.
fn starved(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nofile() -> libc::rlimit {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        r
    }

    fn set_nofile(r: &libc::rlimit) {
        // SAFETY: setrlimit reads the struct we own. (nextest runs each test in its own
        // process, so the lowered limit affects this test only.)
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, r) }, 0);
    }

    /// Out of descriptors, the accept loop waits between tries (a handful of failures in
    /// half a second, not the hundreds of thousands of a spin), and accepts the waiting
    /// connections once descriptors are free again.
    #[tokio::test(flavor = "current_thread")]
    async fn out_of_descriptors_the_loop_backs_off_and_recovers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let clients: Vec<_> = (0..5)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let saved = nofile();
        // SAFETY: dup of a descriptor we own; the number tells how many are open.
        let top = unsafe { libc::dup(0) };
        assert!(top > 0);
        // SAFETY: closing the duplicate just made.
        unsafe { libc::close(top) };
        set_nofile(&libc::rlimit {
            rlim_cur: top as u64,
            rlim_max: saved.rlim_max,
        });
        let gate = Gate::default();
        let accepting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..5 {
                    got.push(gate.accept(&listener).await);
                }
                got
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let failed = gate.errors.load(Ordering::Relaxed);
        set_nofile(&saved);
        let got = accepting.await.unwrap();
        assert!(failed >= 1, "the lowered limit never failed an accept");
        assert!(
            failed <= 20,
            "{failed} failed accepts in 0.5 s: the loop spins"
        );
        assert_eq!(got.len(), 5);
        drop(clients);
    }

    /// Connections that never authenticate take at most the gate's slots; the next waits
    /// until one is given back.
    #[tokio::test(flavor = "current_thread")]
    async fn unauthenticated_connections_are_capped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _clients: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let gate = Gate::new(2);
        let (_a, _, p1) = gate.accept(&listener).await;
        let (_b, _, _p2) = gate.accept(&listener).await;
        let third = tokio::time::timeout(Duration::from_millis(200), gate.accept(&listener));
        assert!(
            third.await.is_err(),
            "a third connection got in past two slots"
        );
        drop(p1);
        let (_c, _, _p3) = gate.accept(&listener).await;
    }
}
