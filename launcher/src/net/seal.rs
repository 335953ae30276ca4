//! Authenticated datagrams between a node's relay and the job's switch. Each carries one
//! Ethernet frame, the rank it belongs to, the relay's session, a sequence number and a MAC
//! (HMAC-SHA256, truncated to 128 bits) keyed by the job's network key, over the direction as
//! well: a frame cannot be replayed, reflected back to its sender, or moved to another VM.
//!
//! Layout: version (1) | direction (1) | rank (4) | session (8) | seq (8) | frame | tag (16).

use hmac::{Hmac, Mac};
use sha2::Sha256;

const VERSION: u8 = 1;
const HEADER: usize = 22;
const TAG: usize = 16;
/// Room the seal adds to a frame.
pub const OVERHEAD: usize = HEADER + TAG;

/// Which way a datagram travels: the MAC covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Relay (a VM) to the switch.
    Up = 1,
    /// Switch to a relay.
    Down = 2,
}

/// The job network's key: HMAC-SHA256(job secret, label), derived by the front-end and every
/// node; it never travels.
#[derive(Clone)]
pub struct NetKey([u8; 32]);

impl NetKey {
    pub fn derive(secret: &agents::secret::JobSecret) -> Self {
        let mut m =
            <Hmac<Sha256>>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
        m.update(b"vse job network key v1");
        Self(m.finalize().into_bytes().into())
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256>>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }
}

impl std::fmt::Debug for NetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetKey(<secret>)")
    }
}

/// Who a datagram is from or for, and its place in that sender's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    pub rank: u32,
    pub session: u64,
    pub seq: u64,
}

pub fn seal(key: &NetKey, dir: Dir, l: Label, frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len() + OVERHEAD);
    out.push(VERSION);
    out.push(dir as u8);
    out.extend_from_slice(&l.rank.to_be_bytes());
    out.extend_from_slice(&l.session.to_be_bytes());
    out.extend_from_slice(&l.seq.to_be_bytes());
    out.extend_from_slice(frame);
    let mut m = key.mac();
    m.update(&out);
    let tag = m.finalize().into_bytes();
    out.extend_from_slice(&tag[..TAG]);
    out
}

/// The label and frame of a datagram sealed with `key` for direction `dir`; None when it is
/// not (forged, damaged, another direction or version). The caller checks the label.
pub fn open<'a>(key: &NetKey, dir: Dir, data: &'a [u8]) -> Option<(Label, &'a [u8])> {
    if data.len() < OVERHEAD || data[0] != VERSION || data[1] != dir as u8 {
        return None;
    }
    let (body, tag) = data.split_at(data.len() - TAG);
    let mut m = key.mac();
    m.update(body);
    m.verify_truncated_left(tag).ok()?;
    let n = |r: std::ops::Range<usize>| body[r].iter().fold(0u64, |a, b| a << 8 | u64::from(*b));
    let label = Label {
        rank: n(2..6) as u32,
        session: n(6..14),
        seq: n(14..22),
    };
    Some((label, &body[HEADER..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_frames_open_only_as_sent() {
        let secret = agents::secret::JobSecret::generate().unwrap();
        let key = NetKey::derive(&secret);
        let l = Label {
            rank: 3,
            session: 0x1122,
            seq: 9,
        };
        let d = seal(&key, Dir::Up, l, b"frame bytes");
        assert_eq!(open(&key, Dir::Up, &d), Some((l, &b"frame bytes"[..])));
        // Reflected (other direction), another job's key, one bit flipped: refused.
        assert_eq!(open(&key, Dir::Down, &d), None);
        let other = NetKey::derive(&agents::secret::JobSecret::generate().unwrap());
        assert_eq!(open(&other, Dir::Up, &d), None);
        for i in [0, 5, 20, d.len() - 1] {
            let mut bad = d.clone();
            bad[i] ^= 1;
            assert_eq!(open(&key, Dir::Up, &bad), None, "byte {i}");
        }
        assert_eq!(open(&key, Dir::Up, &d[..OVERHEAD - 1]), None);
    }
}
