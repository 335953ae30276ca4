//! One VM's way onto the job network, run by the node agent that hosts the VM.
//!
//! QEMU cannot authenticate frames (its datagram transport has no MAC). So the VM's socket
//! is bound to loopback only and connect()ed to its one peer, this relay (the QEMU plugin
//! opens it and passes QEMU the descriptor): the kernel gives it only the relay's datagrams,
//! and a local process writing to the VM's port is refused. The relay's loopback socket is
//! connect()ed to the VM's likewise, and its uplink socket on the allocation network to the
//! job's switch. Towards the switch every frame is sealed with the job's network key
//! (`seal`); from the switch only frames sealed for this rank and this relay's session, in
//! increasing sequence, are passed to the VM. A host on the allocation network, even one
//! forging the switch's address, thus gets no frame into the VM.

use super::NetError;
use super::seal::{Dir, Label, NetKey, open, seal};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Frame counts of one relay, for tests.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Datagrams from the switch's side that failed the check (forged, replayed, not ours).
    pub refused: AtomicU64,
}

/// Runs until dropped.
pub struct Relay {
    /// Where the VM's QEMU binds its end (`-netdev dgram` local).
    pub vm: SocketAddr,
    /// Where the VM's QEMU sends (`-netdev dgram` remote): this relay, on loopback.
    pub relay: SocketAddr,
    /// The relay's address on the allocation network, as the switch sees it.
    pub uplink: SocketAddr,
    /// The session the switch must name in frames for this relay.
    pub session: u64,
    pub stats: Arc<RelayStats>,
    stop: Arc<AtomicBool>,
    socks: [Arc<UdpSocket>; 2],
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// A relay for rank `rank` towards `switch`, its uplink on `bind` (the node's address).
    pub fn start(
        bind: IpAddr,
        switch: SocketAddr,
        key: NetKey,
        rank: u32,
    ) -> Result<Self, NetError> {
        let err = |addr, source| NetError::Bind { addr, source };
        let lo = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        // QEMU cannot report a port it picked: take a free one and leave it to QEMU.
        let vm = UdpSocket::bind(lo)
            .and_then(|s| s.local_addr())
            .map_err(|e| err(lo, e))?;
        let down = UdpSocket::bind(lo).map_err(|e| err(lo, e))?;
        down.connect(vm).map_err(|e| err(vm, e))?;
        let relay = down.local_addr().map_err(|e| err(lo, e))?;
        let want = SocketAddr::new(bind, 0);
        let up = UdpSocket::bind(want).map_err(|e| err(want, e))?;
        up.connect(switch).map_err(|e| err(switch, e))?;
        let uplink = up.local_addr().map_err(|e| err(want, e))?;
        for s in [&down, &up] {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .map_err(|e| err(want, e))?;
        }
        let mut session = [0u8; 8];
        getrandom::fill(&mut session)
            .map_err(|e| err(want, std::io::Error::other(e.to_string())))?;
        let session = u64::from_be_bytes(session);
        let stats = Arc::new(RelayStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (down, up) = (Arc::new(down), Arc::new(up));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| err(want, e))
        };
        let to_switch = {
            let (down, up, key, stop, stats) = (
                down.clone(),
                up.clone(),
                key.clone(),
                stop.clone(),
                stats.clone(),
            );
            spawn(
                "vse-relay-up",
                Box::new(move || {
                    let mut seq = 0u64;
                    pump(&down, &stop, |frame| {
                        seq += 1;
                        let l = Label { rank, session, seq };
                        if up.send(&seal(&key, Dir::Up, l, frame)).is_ok() {
                            stats.up.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                }),
            )?
        };
        let socks = [down.clone(), up.clone()];
        let to_vm = {
            let (stop, stats) = (stop.clone(), stats.clone());
            spawn(
                "vse-relay-down",
                Box::new(move || {
                    let mut last = 0u64;
                    pump(&up, &stop, |data| match open(&key, Dir::Down, data) {
                        Some((l, frame))
                            if l.rank == rank && l.session == session && l.seq > last =>
                        {
                            last = l.seq;
                            if down.send(frame).is_ok() {
                                stats.down.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                }),
            )?
        };
        Ok(Self {
            vm,
            relay,
            uplink,
            session,
            stats,
            stop,
            socks,
            threads: vec![to_switch, to_vm],
        })
    }
}

/// Receives datagrams on `from` until `stop`, handing each to `f`.
fn pump(from: &UdpSocket, stop: &AtomicBool, mut f: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        match from.recv(&mut buf) {
            // Nothing: the socket was shut down to stop (no frame is empty).
            Ok(0) => {}
            Ok(n) => f(&buf[..n]),
            // Timeouts (to notice `stop`) and ICMP errors from a peer not there yet.
            Err(_) => continue,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.socks.iter().for_each(|s| super::wake(s));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
