//! A UDP L2 switch for one job. Each VM's frames come from its node's relay (`relay.rs`),
//! sealed with the job's network key; the switch forwards them, sealed again for each
//! receiver, to the relay of the destination MAC, or to every other relay for broadcast and
//! multicast.
//!
//! Admission: only relays the front-end registered (announced over the authenticated control
//! channel, with their rank and session) are heard, only frames sealed for that rank and
//! session with a sequence number above the last one pass (no forgery, no replay, no frame
//! reflected back), and each relay may only send with its own rank's MAC.

use super::NetError;
use super::seal::{Dir, Label, NetKey, open, seal};
use crate::sync::lock;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Frame counts, for the report and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SwitchStats {
    /// Datagrams sent on to a VM (a flooded frame counts once per receiver).
    pub forwarded: u64,
    /// From an unregistered address.
    pub dropped_unknown_source: u64,
    /// From a registered endpoint but with another MAC, too short, or to an unknown MAC.
    pub dropped_invalid: u64,
    /// From a registered address but not sealed for it (forged, replayed, another session).
    pub dropped_unauthenticated: u64,
}

/// A registered relay.
#[derive(Debug, Clone, Copy)]
struct Port {
    rank: u32,
    mac: [u8; 6],
    session: u64,
    /// Highest sequence number heard from it.
    heard: u64,
    /// Last sequence number sent to it.
    sent: u64,
}

struct Shared {
    key: NetKey,
    stop: AtomicBool,
    /// Registered relay endpoint → what it may send as.
    ports: Mutex<HashMap<SocketAddr, Port>>,
    forwarded: AtomicU64,
    unknown: AtomicU64,
    invalid: AtomicU64,
    unauthenticated: AtomicU64,
}

/// Runs until dropped.
pub struct Switch {
    addr: SocketAddr,
    shared: Arc<Shared>,
    sock: Arc<UdpSocket>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Switch {
    /// Listens on an ephemeral UDP port of `ip` (the front-end's allocation address); frames
    /// are sealed with `key`.
    pub fn start(ip: IpAddr, key: NetKey) -> Result<Self, NetError> {
        Self::start_at(SocketAddr::new(ip, 0), key)
    }

    /// Listens on `want`: where the VMs' relays of a running job send (a new front-end
    /// taking over a job restarts its switch there).
    pub fn start_at(want: SocketAddr, key: NetKey) -> Result<Self, NetError> {
        let bind = |source| NetError::Bind { addr: want, source };
        let sock = UdpSocket::bind(want).map_err(bind)?;
        let addr = sock.local_addr().map_err(bind)?;
        // Wakes the loop now and then to notice `stop`.
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(bind)?;
        let shared = Arc::new(Shared {
            key,
            stop: AtomicBool::new(false),
            ports: Mutex::default(),
            forwarded: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            unauthenticated: AtomicU64::new(0),
        });
        let (s, sock) = (shared.clone(), Arc::new(sock));
        let rx = sock.clone();
        let thread = std::thread::Builder::new()
            .name("vse-switch".into())
            .spawn(move || run(&rx, &s))
            .map_err(bind)?;
        Ok(Self {
            addr,
            shared,
            sock,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Admits the relay at `endpoint` for rank `rank` in `session`, which may only send
    /// frames from `mac`; it replaces the rank's previous relay (a VM that moved).
    pub fn register(&self, endpoint: SocketAddr, rank: u32, session: u64, mac: [u8; 6]) {
        let mut p = lock(&self.shared.ports);
        p.retain(|_, port| port.mac != mac && port.rank != rank);
        let port = Port {
            rank,
            mac,
            session,
            heard: 0,
            sent: 0,
        };
        p.insert(endpoint, port);
    }

    pub fn stats(&self) -> SwitchStats {
        SwitchStats {
            forwarded: self.shared.forwarded.load(Ordering::Relaxed),
            dropped_unknown_source: self.shared.unknown.load(Ordering::Relaxed),
            dropped_invalid: self.shared.invalid.load(Ordering::Relaxed),
            dropped_unauthenticated: self.shared.unauthenticated.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        super::wake(&self.sock);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(sock: &UdpSocket, s: &Shared) {
    // Jumbo frames are not configured: 64 KiB covers any datagram anyway.
    let mut buf = vec![0u8; 65536];
    while !s.stop.load(Ordering::Relaxed) {
        let (n, src) = match sock.recv_from(&mut buf) {
            // Nothing: the socket was shut down to stop (no frame is empty).
            Ok((0, _)) => continue,
            Ok(r) => r,
            // Timeouts (to notice `stop`), and ICMP port-unreachable from a relay that
            // stopped: not fatal.
            Err(_) => continue,
        };
        let mut ports = lock(&s.ports);
        let Some(own) = ports.get(&src).copied() else {
            s.unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let frame = match open(&s.key, Dir::Up, &buf[..n]) {
            Some((l, frame))
                if l.rank == own.rank && l.session == own.session && l.seq > own.heard =>
            {
                if let Some(p) = ports.get_mut(&src) {
                    p.heard = l.seq;
                }
                frame
            }
            _ => {
                s.unauthenticated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if frame.len() < 14 || frame[6..12] != own.mac[..] {
            s.invalid.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let dst = &frame[0..6];
        let targets: Vec<SocketAddr> = ports
            .iter()
            .filter(|(a, p)| **a != src && (dst[0] & 1 == 1 || p.mac[..] == *dst))
            .map(|(a, _)| *a)
            .collect();
        if targets.is_empty() && dst[0] & 1 == 0 {
            s.invalid.fetch_add(1, Ordering::Relaxed);
        }
        for t in targets {
            let Some(p) = ports.get_mut(&t) else { continue };
            p.sent += 1;
            let l = Label {
                rank: p.rank,
                session: p.session,
                seq: p.sent,
            };
            if sock.send_to(&seal(&s.key, Dir::Down, l, frame), t).is_ok() {
                s.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: [u8; 6], src: [u8; 6], body: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(body);
        f
    }

    /// A stand-in relay: a socket that seals what it sends as rank `rank`.
    struct Ep {
        s: UdpSocket,
        rank: u32,
        seq: u64,
    }

    impl Ep {
        fn new(rank: u32) -> Self {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            Ep { s, rank, seq: 0 }
        }
        fn send(&mut self, key: &NetKey, f: &[u8], to: SocketAddr) {
            self.seq += 1;
            let l = Label {
                rank: self.rank,
                session: u64::from(self.rank) + 100,
                seq: self.seq,
            };
            self.s.send_to(&seal(key, Dir::Up, l, f), to).unwrap();
        }
        fn recv(&self, key: &NetKey) -> Option<Vec<u8>> {
            let mut b = [0u8; 2048];
            let n = self.s.recv(&mut b).ok()?;
            let (l, f) = open(key, Dir::Down, &b[..n]).expect("sealed by the switch");
            assert_eq!((l.rank, l.session), (self.rank, u64::from(self.rank) + 100));
            Some(f.to_vec())
        }
    }

    #[test]
    fn forwards_sealed_frames_between_registered_relays_only() {
        let key = NetKey::derive(&agents::secret::JobSecret::generate().unwrap());
        let sw = Switch::start("127.0.0.1".parse().unwrap(), key.clone()).unwrap();
        let (mut a, b, mut c, mut stranger) = (Ep::new(0), Ep::new(1), Ep::new(2), Ep::new(9));
        let (ma, mb, mc) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 3]);
        for (e, m) in [(&a, ma), (&b, mb), (&c, mc)] {
            sw.register(
                e.s.local_addr().unwrap(),
                e.rank,
                u64::from(e.rank) + 100,
                m,
            );
        }
        let to = sw.addr();
        // Unicast a → b: only b gets it.
        let f = frame(mb, ma, b"hello b");
        a.send(&key, &f, to);
        assert_eq!(b.recv(&key).unwrap(), f);
        // Broadcast from c: a and b.
        let f = frame([0xff; 6], mc, b"all");
        c.send(&key, &f, to);
        assert_eq!(a.recv(&key).unwrap(), f);
        assert_eq!(b.recv(&key).unwrap(), f);
        // Dropped: a stranger; a registered relay using another VM's MAC; a raw frame from a
        // registered address (not sealed); a replayed datagram; another job's key.
        stranger.send(&key, &frame(mb, [2, 9, 9, 9, 9, 9], b"x"), to);
        a.send(&key, &frame(mb, mc, b"spoof"), to);
        a.s.send_to(&frame(mb, ma, b"raw"), to).unwrap();
        let replay = seal(
            &key,
            Dir::Up,
            Label {
                rank: 0,
                session: 100,
                seq: 1,
            },
            &frame(mb, ma, b"again"),
        );
        a.s.send_to(&replay, to).unwrap();
        let other = NetKey::derive(&agents::secret::JobSecret::generate().unwrap());
        a.send(&other, &frame(mb, ma, b"foreign key"), to);
        // A marker sent after them arrives first at b: none was forwarded.
        let f = frame(mb, mc, b"marker");
        c.send(&key, &f, to);
        assert_eq!(b.recv(&key).unwrap(), f);
        // The switch counts a frame after sending it: b may hold the marker a moment before
        // the counter moves.
        let mut st = sw.stats();
        for _ in 0..100 {
            if st.forwarded >= 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            st = sw.stats();
        }
        assert_eq!(st.forwarded, 4, "{st:?}");
        assert_eq!(st.dropped_unknown_source, 1, "{st:?}");
        assert_eq!(st.dropped_invalid, 1, "{st:?}");
        assert_eq!(st.dropped_unauthenticated, 3, "{st:?}");
        // Nothing was ever sent to c or the stranger.
        c.s.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        assert!(c.recv(&key).is_none());
    }
}
