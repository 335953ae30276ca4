//! Addresses of a job's VMs: deterministic per rank, so every node derives the same MAC,
//! address and name for a rank without asking anyone.

use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetError {
    #[error(
        "network {base}/{prefix}: room for {room} VM(s), the job has {size}; hint: use a larger range (the policy's network.ip_range) or fewer VMs"
    )]
    TooSmall {
        base: Ipv4Addr,
        prefix: u8,
        room: u64,
        size: u32,
    },
    #[error("network prefix /{0}: expected 8..=30")]
    Prefix(u8),
    #[error("cannot open the job's switch on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The job's segment and where its switch listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNet {
    /// Network address of the segment (host bits zero).
    pub base: Ipv4Addr,
    pub prefix: u8,
    /// The front-end's switch, on the allocation network.
    pub switch: SocketAddr,
}

/// One VM's identity on the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankNet {
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub prefix: u8,
}

impl JobNet {
    /// The default segment, 10.251.0.0/16: private, and unlikely to clash with a site's own.
    pub const DEFAULT_BASE: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 0);
    pub const DEFAULT_PREFIX: u8 = 16;

    /// Checks that `size` VMs fit: rank r gets host number r + 2 (.1 stays free for a
    /// gateway a site may add; the broadcast address is never used).
    pub fn new(
        base: Ipv4Addr,
        prefix: u8,
        switch: SocketAddr,
        size: u32,
    ) -> Result<Self, NetError> {
        if !(8..=30).contains(&prefix) {
            return Err(NetError::Prefix(prefix));
        }
        let mask = u32::MAX << (32 - u32::from(prefix));
        let base = Ipv4Addr::from(u32::from(base) & mask);
        let room = (1u64 << (32 - prefix)) - 3;
        if u64::from(size) > room {
            return Err(NetError::TooSmall {
                base,
                prefix,
                room,
                size,
            });
        }
        Ok(Self {
            base,
            prefix,
            switch,
        })
    }

    /// Rank `rank`'s MAC (locally administered, unicast: 02:fb:…) and address.
    pub fn rank(&self, rank: u32) -> RankNet {
        let r = rank.to_be_bytes();
        RankNet {
            mac: [0x02, 0xfb, r[0], r[1], r[2], r[3]],
            ip: Ipv4Addr::from(u32::from(self.base) + rank + 2),
            prefix: self.prefix,
        }
    }
}

impl RankNet {
    pub fn mac_string(&self) -> String {
        self.mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// The key of the guests' rsh service (hex): HMAC-SHA256(job secret, label), so every node
/// derives the same key and it never travels on any network (only over virtio-serial).
pub fn guest_key(secret: &agents::secret::JobSecret) -> String {
    use hmac::{Hmac, Mac};
    let mut m =
        <Hmac<sha2::Sha256>>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    m.update(b"vse guest rsh key v1");
    hex::encode(m.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_distinct_deterministic_addresses() {
        let sw: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let n = JobNet::new(Ipv4Addr::new(10, 251, 7, 9), 16, sw, 3).unwrap();
        assert_eq!(n.base, Ipv4Addr::new(10, 251, 0, 0));
        assert_eq!(n.rank(0).ip, Ipv4Addr::new(10, 251, 0, 2));
        assert_eq!(n.rank(300).ip, Ipv4Addr::new(10, 251, 1, 46));
        assert_eq!(n.rank(258).mac_string(), "02:fb:00:00:01:02");
        // /30: 4 addresses, network + .1 + broadcast reserved: one VM.
        assert!(JobNet::new(Ipv4Addr::new(10, 0, 0, 0), 30, sw, 1).is_ok());
        let e = JobNet::new(Ipv4Addr::new(10, 0, 0, 0), 30, sw, 2).unwrap_err();
        assert!(
            matches!(
                e,
                NetError::TooSmall {
                    room: 1,
                    size: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = JobNet::new(Ipv4Addr::new(10, 0, 0, 0), 31, sw, 1).unwrap_err();
        assert!(matches!(e, NetError::Prefix(31)), "{e}");
    }
}
