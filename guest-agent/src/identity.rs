//! A fresh identity for a guest restored from a boot template (`reidentify`): many VMs resume
//! from one saved memory state, so everything that state fixed must change in each of them:
//! the kernel's random state (host bytes mixed in, then a forced reseed, on top of the
//! hypervisor's VM generation id), the machine id, the hostname, the clock, and the NIC's MAC.

use crate::net::{self, NetError};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("invalid {what}: {value:?}")]
    Invalid { what: &'static str, value: String },
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("NIC: {0}")]
    Net(#[from] NetError),
}

/// What the host asks for (see `Request::Reidentify`).
pub struct Identity<'a> {
    pub hostname: &'a str,
    /// 32 lowercase hex digits.
    pub machine_id: &'a str,
    /// Host random bytes, at least 32.
    pub entropy: &'a [u8],
    /// The host's clock, in nanoseconds since the Unix epoch.
    pub time_unix_ns: u64,
    pub mac: Option<&'a str>,
}

const MIN_ENTROPY: usize = 32;

fn sys(what: &'static str) -> IdentityError {
    IdentityError::Sys {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Checks what the host sent before anything changes.
fn check(id: &Identity) -> Result<(), IdentityError> {
    let bad = |what, value: &str| IdentityError::Invalid {
        what,
        value: value.into(),
    };
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if id.machine_id.len() != 32 || !hex(id.machine_id) || id.machine_id.bytes().all(|b| b == b'0')
    {
        return Err(bad("machine id", id.machine_id));
    }
    if id.hostname.is_empty() || id.hostname.len() > 64 || id.hostname.contains(['\0', '/']) {
        return Err(bad("hostname", id.hostname));
    }
    if id.entropy.len() < MIN_ENTROPY {
        return Err(bad("entropy", &format!("{} bytes", id.entropy.len())));
    }
    Ok(())
}

/// Takes on the identity: randomness first (nothing after it may draw from the old state).
pub fn apply(id: &Identity) -> Result<(), IdentityError> {
    check(id)?;
    reseed(id.entropy)?;
    // A guest running from its initramfs may have no /etc yet.
    std::fs::create_dir_all("/etc").map_err(|source| IdentityError::Sys {
        what: "creating /etc",
        source,
    })?;
    net::write_atomic(
        Path::new("/etc/machine-id"),
        &format!("{}\n", id.machine_id),
    )?;
    // SAFETY: pointer and length of a live byte slice.
    if unsafe { libc::sethostname(id.hostname.as_ptr().cast(), id.hostname.len()) } < 0 {
        return Err(sys("sethostname"));
    }
    let ts = libc::timespec {
        tv_sec: (id.time_unix_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (id.time_unix_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } < 0 {
        return Err(sys("setting the clock"));
    }
    if let Some(mac) = id.mac {
        net::claim_mac(mac)?;
    }
    Ok(())
}

/// Mixes `bytes` into the kernel's input pool, crediting them (RNDADDENTROPY), then makes the
/// kernel reseed its CRNG from the pool now (RNDRESEEDCRNG) rather than at its next interval.
fn reseed(bytes: &[u8]) -> Result<(), IdentityError> {
    use std::os::fd::AsRawFd;
    // _IOW('R', 0x03, int[2]) and _IO('R', 0x07), <linux/random.h>.
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(|source| IdentityError::Sys {
            what: "opening /dev/urandom",
            source,
        })?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + bytes.len());
    info.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    info.extend_from_slice(bytes);
    // Whole u32 words: the kernel reads buf_size bytes, the buffer is padded to be safe.
    info.resize(info.len().next_multiple_of(4), 0);
    // SAFETY: `info` is a rand_pool_info of `buf_size` bytes; the kernel only reads it.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } < 0 {
        return Err(sys("adding entropy (RNDADDENTROPY)"));
    }
    // SAFETY: no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) } < 0 {
        return Err(sys("reseeding the CRNG (RNDRESEEDCRNG)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id<'a>(machine_id: &'a str, hostname: &'a str, entropy: &'a [u8]) -> Identity<'a> {
        Identity {
            hostname,
            machine_id,
            entropy,
            time_unix_ns: 0,
            mac: None,
        }
    }

    #[test]
    fn bad_requests_are_refused_before_anything_changes() {
        let e = [7u8; 32];
        let good = "0123456789abcdef0123456789abcdef";
        check(&id(good, "vm-1", &e)).unwrap();
        for (m, h, n) in [
            ("0123", "vm-1", 32),
            ("0123456789ABCDEF0123456789abcdef", "vm-1", 32),
            ("00000000000000000000000000000000", "vm-1", 32),
            (good, "", 32),
            (good, "a/b", 32),
            (good, "vm-1", 16),
        ] {
            let err = check(&id(m, h, &e[..n])).unwrap_err();
            assert!(matches!(err, IdentityError::Invalid { .. }), "{err}");
        }
    }
}
