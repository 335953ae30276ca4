//! The page's listener: at most [`MAX_CONNECTIONS`] open connections (a local user opening
//! connections without end takes a bounded share, not the server's descriptors), and an
//! accept that fails for want of descriptors waits before the next try (axum's own listener
//! does the same after any other error).

use axum::serve::Listener;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Open connections at once (browsers keep a few each, the event stream one).
pub const MAX_CONNECTIONS: usize = 256;

pub struct Capped {
    inner: TcpListener,
    slots: Arc<Semaphore>,
}

impl Capped {
    pub fn new(inner: TcpListener, max: usize) -> Self {
        Capped {
            inner,
            slots: Arc::new(Semaphore::new(max)),
        }
    }
}

/// A connection and the slot it holds until it closes.
pub struct Slotted {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Listener for Capped {
    type Io = Slotted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Slotted, SocketAddr) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                std::future::pending::<()>().await;
                unreachable!();
            };
            match self.inner.accept().await {
                Ok((stream, peer)) => {
                    return (
                        Slotted {
                            stream,
                            _slot: slot,
                        },
                        peer,
                    );
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(_) => {}
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Slotted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slotted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn connections_past_the_cap_wait_for_a_slot() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut capped = Capped::new(l, 2);
        let _c: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let (a, _) = capped.accept().await;
        let (_b, _) = capped.accept().await;
        let third = tokio::time::timeout(Duration::from_millis(200), capped.accept()).await;
        assert!(third.is_err(), "a third connection got in past two slots");
        drop(a);
        let _ = capped.accept().await;
    }
}
