//! A UDP L2 switch for one job. Each VM's QEMU sends its Ethernet frames as datagrams from
//! its own UDP endpoint (`-netdev dgram`) to the switch, which forwards them to the endpoint
//! of the destination MAC, or to every other endpoint for broadcast and multicast.
//!
//! Admission is by source address: only endpoints the front-end registered for this job's
//! VMs (announced over the authenticated control channel) are heard, and each may only send
//! with its own rank's MAC. QEMU cannot authenticate frames (no HMAC in its datagram
//! transport), so a host on the allocation network that forges a registered source address
//! could still inject frames: the segment is as private as the allocation network itself.

use super::NetError;
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
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Registered endpoint → the MAC it owns.
    ports: Mutex<HashMap<SocketAddr, [u8; 6]>>,
    forwarded: AtomicU64,
    unknown: AtomicU64,
    invalid: AtomicU64,
}

/// Runs until dropped.
pub struct Switch {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Switch {
    /// Listens on an ephemeral UDP port of `ip` (the front-end's allocation address).
    pub fn start(ip: IpAddr) -> Result<Self, NetError> {
        let want = SocketAddr::new(ip, 0);
        let bind = |source| NetError::Bind { addr: want, source };
        let sock = UdpSocket::bind(want).map_err(bind)?;
        let addr = sock.local_addr().map_err(bind)?;
        // Wakes the loop now and then to notice `stop`.
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(bind)?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vse-switch".into())
            .spawn(move || run(&sock, &s))
            .map_err(bind)?;
        Ok(Self {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Admits `endpoint`, which may only send frames from `mac`.
    pub fn register(&self, endpoint: SocketAddr, mac: [u8; 6]) {
        let mut p = lock(&self.shared.ports);
        p.retain(|_, m| *m != mac);
        p.insert(endpoint, mac);
    }

    pub fn stats(&self) -> SwitchStats {
        SwitchStats {
            forwarded: self.shared.forwarded.load(Ordering::Relaxed),
            dropped_unknown_source: self.shared.unknown.load(Ordering::Relaxed),
            dropped_invalid: self.shared.invalid.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
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
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            // ICMP port-unreachable from a VM that stopped surfaces here: not fatal.
            Err(_) => continue,
        };
        let ports = lock(&s.ports).clone();
        let Some(own) = ports.get(&src) else {
            s.unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let frame = &buf[..n];
        if n < 14 || frame[6..12] != own[..] {
            s.invalid.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let dst = &frame[0..6];
        let targets: Vec<SocketAddr> = if dst[0] & 1 == 1 {
            // Broadcast or multicast: every other VM of the job.
            ports.keys().filter(|a| **a != src).copied().collect()
        } else {
            ports
                .iter()
                .filter(|(a, m)| m[..] == *dst && **a != src)
                .map(|(a, _)| *a)
                .collect()
        };
        if targets.is_empty() && dst[0] & 1 == 0 {
            s.invalid.fetch_add(1, Ordering::Relaxed);
        }
        for t in targets {
            if sock.send_to(frame, t).is_ok() {
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

    fn recv(s: &UdpSocket) -> Option<Vec<u8>> {
        let mut b = [0u8; 2048];
        s.recv(&mut b).ok().map(|n| b[..n].to_vec())
    }

    #[test]
    fn forwards_between_registered_endpoints_only() {
        let sw = Switch::start("127.0.0.1".parse().unwrap()).unwrap();
        let ep = || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        };
        let (a, b, c, stranger) = (ep(), ep(), ep(), ep());
        let (ma, mb, mc) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 3]);
        sw.register(a.local_addr().unwrap(), ma);
        sw.register(b.local_addr().unwrap(), mb);
        sw.register(c.local_addr().unwrap(), mc);
        let to = sw.addr();
        // Unicast a → b: only b gets it.
        let f = frame(mb, ma, b"hello b");
        a.send_to(&f, to).unwrap();
        assert_eq!(recv(&b).unwrap(), f);
        // Broadcast from c: a and b.
        let f = frame([0xff; 6], mc, b"all");
        c.send_to(&f, to).unwrap();
        assert_eq!(recv(&a).unwrap(), f);
        assert_eq!(recv(&b).unwrap(), f);
        // Dropped: a stranger, and a registered endpoint using another VM's MAC.
        stranger
            .send_to(&frame(mb, [2, 9, 9, 9, 9, 9], b"x"), to)
            .unwrap();
        a.send_to(&frame(mb, mc, b"spoof"), to).unwrap();
        // A marker sent after them arrives first at b: the two were not forwarded.
        let f = frame(mb, mc, b"marker");
        c.send_to(&f, to).unwrap();
        assert_eq!(recv(&b).unwrap(), f);
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
        // Nothing was ever sent to c or the stranger.
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert!(recv(&c).is_none());
    }
}
