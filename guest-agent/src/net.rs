//! Network set-up inside the guest, asked for by the host (`net-config`): the NIC with the
//! job's MAC gets its address, loopback comes up, the hostname and `/etc/hosts` name every
//! VM of the job. Done with ioctls on a socket, so images need no iproute2 or ifupdown.

use crate::sync::lock;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("no network interface with MAC {mac} appeared within {secs} s (is virtio_net loaded?)")]
    NoInterface { mac: String, secs: u64 },
    #[error("{what} on {iface}: {source}")]
    Ioctl {
        what: &'static str,
        iface: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid {what}: {value:?}")]
    Invalid { what: &'static str, value: String },
    #[error("rsh key: expected at least 16 bytes in hex")]
    RshKey,
    #[error("rsh listener on {addr}: {source}")]
    RshListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The interface under `sys_net` (normally /sys/class/net) whose MAC is `mac`.
pub fn iface_by_mac(sys_net: &Path, mac: &str) -> Option<String> {
    std::fs::read_dir(sys_net).ok()?.flatten().find_map(|e| {
        let addr = std::fs::read_to_string(e.path().join("address")).ok()?;
        addr.trim()
            .eq_ignore_ascii_case(mac)
            .then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// The one ethernet NIC under `sys_net` (ARP hardware type 1, not loopback), when there is
/// exactly one: a VM restored from a template carries the template VM's MAC on its NIC.
pub fn single_ethernet(sys_net: &Path) -> Option<String> {
    let mut found = std::fs::read_dir(sys_net).ok()?.flatten().filter_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let kind = std::fs::read_to_string(e.path().join("type")).ok()?;
        (name != "lo" && kind.trim() == "1").then_some(name)
    });
    let one = found.next()?;
    found.next().is_none().then_some(one)
}

/// `/etc/hosts`: loopback, then every VM of the job.
pub fn hosts_file(hosts: &[(String, Ipv4Addr)]) -> String {
    let mut s = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for (name, ip) in hosts {
        s.push_str(&format!("{ip}\t{name}\n"));
    }
    s
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(iface: &str) -> Result<Self, NetError> {
        if iface.is_empty() || iface.len() >= libc::IFNAMSIZ || iface.contains('\0') {
            return Err(NetError::Invalid {
                what: "interface name",
                value: iface.into(),
            });
        }
        let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
        for (d, s) in name.iter_mut().zip(iface.bytes()) {
            *d = s as libc::c_char;
        }
        Ok(Self {
            name,
            data: [0; 24],
        })
    }

    /// A `struct sockaddr_in` for `ip` in the request's union.
    fn with_addr(mut self, ip: Ipv4Addr) -> Self {
        self.data[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        self.data[4..8].copy_from_slice(&ip.octets());
        self
    }
}

struct Sock(libc::c_int);

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn ioctl(
    s: &Sock,
    req: libc::c_ulong,
    r: &mut IfReq,
    what: &'static str,
    iface: &str,
) -> Result<(), NetError> {
    // SAFETY: `r` is a valid, writable ifreq-sized buffer for these SIOC* requests.
    let rc = unsafe { libc::ioctl(s.0, req as _, r as *mut IfReq) };
    if rc < 0 {
        return Err(NetError::Ioctl {
            what,
            iface: iface.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn up(s: &Sock, iface: &str) -> Result<(), NetError> {
    let mut r = IfReq::new(iface)?;
    ioctl(s, libc::SIOCGIFFLAGS, &mut r, "reading flags", iface)?;
    let flags =
        i16::from_ne_bytes([r.data[0], r.data[1]]) | (libc::IFF_UP | libc::IFF_RUNNING) as i16;
    r.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl(s, libc::SIOCSIFFLAGS, &mut r, "bringing up", iface)
}

fn parse_mac(mac: &str) -> Result<[u8; 6], NetError> {
    let bad = || NetError::Invalid {
        what: "MAC address",
        value: mac.into(),
    };
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| bad())
}

/// Gives the guest's NIC the MAC the host asked for: the NIC that has it already, else the
/// single ethernet NIC, whose address is set with `SIOCSIFHWADDR` (virtio-net passes it to
/// the hypervisor over its control queue, so the host side filters by the new MAC too).
/// Returns the interface, `None` when the guest has no NIC at all.
pub fn claim_mac(mac: &str) -> Result<Option<String>, NetError> {
    const SIOCSIFHWADDR: libc::c_ulong = 0x8924;
    let sys = Path::new("/sys/class/net");
    let bytes = parse_mac(mac)?;
    if let Some(i) = iface_by_mac(sys, mac) {
        return Ok(Some(i));
    }
    let Some(iface) = single_ethernet(sys) else {
        return Ok(None);
    };
    let s = socket(&iface)?;
    let mut r = IfReq::new(&iface)?;
    // struct sockaddr: family ARPHRD_ETHER, then the address.
    r.data[..2].copy_from_slice(&1u16.to_ne_bytes());
    r.data[2..8].copy_from_slice(&bytes);
    ioctl(&s, SIOCSIFHWADDR, &mut r, "setting the MAC address", &iface)?;
    Ok(Some(iface))
}

fn socket(iface: &str) -> Result<Sock, NetError> {
    // SAFETY: plain socket(2); the descriptor is owned by `Sock`.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(NetError::Ioctl {
            what: "socket",
            iface: iface.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(Sock(fd))
}

/// What the host asks for.
pub struct NetConfig<'a> {
    pub mac: &'a str,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub hostname: &'a str,
    pub hosts: &'a [(String, Ipv4Addr)],
}

/// Configures the guest; returns the interface name used.
pub fn configure(c: &NetConfig) -> Result<String, NetError> {
    if c.prefix > 32 {
        return Err(NetError::Invalid {
            what: "prefix length",
            value: c.prefix.to_string(),
        });
    }
    // The NIC may still be probing when the agent is asked.
    let wait = Duration::from_secs(20);
    let t0 = Instant::now();
    let iface = loop {
        if let Some(i) = iface_by_mac(Path::new("/sys/class/net"), c.mac) {
            break i;
        }
        if t0.elapsed() > wait {
            return Err(NetError::NoInterface {
                mac: c.mac.into(),
                secs: wait.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let s = socket(&iface)?;
    up(&s, "lo")?;
    let mask = if c.prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(c.prefix))
    };
    let mut r = IfReq::new(&iface)?.with_addr(c.ip);
    ioctl(&s, libc::SIOCSIFADDR, &mut r, "setting the address", &iface)?;
    let mut r = IfReq::new(&iface)?.with_addr(Ipv4Addr::from(mask));
    ioctl(
        &s,
        libc::SIOCSIFNETMASK,
        &mut r,
        "setting the netmask",
        &iface,
    )?;
    up(&s, &iface)?;
    if !c.hostname.is_empty() {
        // SAFETY: pointer and length of a live byte slice.
        let rc = unsafe { libc::sethostname(c.hostname.as_ptr().cast(), c.hostname.len()) };
        if rc < 0 {
            return Err(NetError::Ioctl {
                what: "sethostname",
                iface: iface.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    write_atomic(Path::new("/etc/hosts"), &hosts_file(c.hosts))?;
    Ok(iface)
}

/// Keeps the job key for `vse-agent rsh` clients and serves rsh on `ip` (once per boot: a
/// repeated request, e.g. after the host channel came back, finds it running).
pub fn start_rsh(
    ip: Ipv4Addr,
    key_hex: &str,
    env: std::collections::BTreeMap<String, String>,
    user: Option<crate::protocol::GuestUser>,
) -> Result<(), NetError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static STARTED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let key = crate::rsh::unhex(key_hex)
        .filter(|k| k.len() >= 16)
        .ok_or(NetError::RshKey)?;
    let mut started = lock(&STARTED);
    if *started {
        return Ok(());
    }
    let path = Path::new(crate::rsh::KEY_FILE);
    let tmp = path.with_extension("tmp");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(key_hex.as_bytes()))
        // The job's own `vse-agent rsh` clients (mpirun's) run as the job's user.
        .and_then(|_| match &user {
            Some(u) => std::os::unix::fs::chown(&tmp, Some(u.uid), Some(u.gid)),
            None => Ok(()),
        })
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| NetError::File {
            path: path.display().to_string(),
            source,
        })?;
    let addr = std::net::SocketAddr::from((ip, crate::rsh::RSH_PORT));
    crate::rsh::listen(addr, key, env, user)
        .map_err(|source| NetError::RshListen { addr, source })?;
    *started = true;
    Ok(())
}

pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<(), NetError> {
    let tmp = path.with_extension("vse-tmp");
    let err = |source| NetError::File {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_found_by_mac_and_hosts_rendered() {
        let d = std::env::temp_dir().join(format!("vse-ga-sysnet-{}", std::process::id()));
        for (n, m) in [("lo", "00:00:00:00:00:00"), ("eth0", "02:fb:00:00:00:01")] {
            std::fs::create_dir_all(d.join(n)).unwrap();
            std::fs::write(d.join(n).join("address"), format!("{m}\n")).unwrap();
        }
        assert_eq!(
            iface_by_mac(&d, "02:FB:00:00:00:01").as_deref(),
            Some("eth0")
        );
        assert_eq!(iface_by_mac(&d, "02:fb:00:00:00:02"), None);
        // The single ethernet NIC, whatever its MAC; none when two could be meant.
        std::fs::write(d.join("lo").join("type"), "772\n").unwrap();
        std::fs::write(d.join("eth0").join("type"), "1\n").unwrap();
        assert_eq!(single_ethernet(&d).as_deref(), Some("eth0"));
        std::fs::create_dir_all(d.join("eth1")).unwrap();
        std::fs::write(d.join("eth1").join("type"), "1\n").unwrap();
        assert_eq!(single_ethernet(&d), None);
        std::fs::remove_dir_all(&d).unwrap();
        let h = hosts_file(&[("j-r0".into(), Ipv4Addr::new(10, 251, 0, 2))]);
        assert!(h.starts_with("127.0.0.1\tlocalhost\n"));
        assert!(h.ends_with("10.251.0.2\tj-r0\n"));
        assert!(IfReq::new("a-name-much-too-long").is_err());
        assert_eq!(
            parse_mac("02:fb:00:00:00:0a").unwrap(),
            [2, 0xfb, 0, 0, 0, 10]
        );
        assert!(parse_mac("02:fb:00:00:00").is_err());
        assert!(parse_mac("02:fb:00:00:00:zz").is_err());
        let r = IfReq::new("eth0")
            .unwrap()
            .with_addr(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(&r.data[4..8], &[10, 1, 2, 3]);
    }
}
