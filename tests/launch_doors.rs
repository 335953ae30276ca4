//! No open doors while a job runs, end to end with the real binary, real agents and two real
//! TCG VMs on the job network (`local:2`):
//!
//! - no socket of the job's processes (`vse` front-end, node agents, QEMU) is bound to a
//!   wildcard address (read from /proc/net/{tcp,udp}{,6} by the inodes in each process's fds);
//! - frames injected at the job network's endpoints on the allocation network (the switch and
//!   every node's uplink), with their source address forged to be each of the job's own UDP
//!   endpoints in turn (a raw socket), do not reach rank 0's guest: its NIC's receive counter
//!   does not move, while the ranks' own traffic (a TCP exchange) went through.
//!
//! Needs QEMU, VSE_GUEST_AGENT and root (raw sockets, other processes' fds).

mod support;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use support::vm::{accel_note, built_image, no_qemu_left, vm_slot, vm_tools};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// One socket of /proc/net/*: local and remote address as text (printed when the test fails),
/// and whether it is a wildcard.
#[derive(Debug, Clone)]
#[allow(dead_code)] // read through Debug
struct Sock {
    table: &'static str,
    local: String,
    remote: String,
    wildcard: bool,
    v4: Option<(SocketAddrV4, SocketAddrV4)>,
}

fn hex_v4(s: &str) -> Option<SocketAddrV4> {
    let (ip, port) = s.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints the address in host byte order of the network-order value.
    Some(SocketAddrV4::new(Ipv4Addr::from(ip.swap_bytes()), port))
}

/// Every socket of the machine's tables, by inode.
fn sockets() -> HashMap<u64, Sock> {
    let mut out = HashMap::new();
    for table in ["tcp", "tcp6", "udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state, inode) = (f[1], f[2], f[3], f[9].parse().unwrap());
            // TCP: only listeners matter (connections are accepted ones or outgoing).
            if table.starts_with("tcp") && state != "0A" {
                continue;
            }
            let addr = local.split(':').next().unwrap();
            let wildcard = addr.bytes().all(|b| b == b'0');
            let v4 = (table == "udp").then(|| Some((hex_v4(local)?, hex_v4(remote)?)));
            let (local, remote) = (local.to_string(), remote.to_string());
            let v4 = v4.flatten();
            out.insert(
                inode,
                Sock {
                    table,
                    local,
                    remote,
                    wildcard,
                    v4,
                },
            );
        }
    }
    out
}

/// `root` and every process below it, with its command name.
fn tree(root: u32) -> Vec<(u32, String)> {
    let mut parent = HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (name, rest) = stat.split_once(") ").unwrap();
        let ppid: u32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
        parent.insert(pid, (ppid, name.split_once(" (").unwrap().1.to_string()));
    }
    let mut out = vec![(root, "vse".to_string())];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].0;
        for (c, (pp, name)) in &parent {
            if *pp == p {
                out.push((*c, name.clone()));
            }
        }
        i += 1;
    }
    out
}

fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter_map(|f| std::fs::read_link(f.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// An IPv4/UDP datagram from `src` to `dst` carrying `payload`, sent through a raw socket (the
/// source address is whatever we say).
fn send_forged(raw: i32, src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) {
    let len = 28 + payload.len();
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.ip().octets());
    p[16..20].copy_from_slice(&dst.ip().octets());
    let mut sum = 0u32;
    for c in p[..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p[20..22].copy_from_slice(&src.port().to_be_bytes());
    p[22..24].copy_from_slice(&dst.port().to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `p` and `to` outlive the call; the lengths are theirs.
    let n = unsafe {
        libc::sendto(
            raw,
            p.as_ptr().cast(),
            p.len(),
            0,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    assert_eq!(
        n,
        len as isize,
        "raw send: {}",
        std::io::Error::last_os_error()
    );
}

/// An Ethernet frame from rank 1 to rank 0 (the MACs every node derives), IPv4/UDP inside.
fn frame_to_rank0() -> Vec<u8> {
    let mut f = vec![0x02, 0xfb, 0, 0, 0, 0, 0x02, 0xfb, 0, 0, 0, 1, 0x08, 0x00];
    let mut ip = vec![
        0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0, 10, 20, 0, 3, 10, 20, 0, 2,
    ];
    ip.extend_from_slice(&[0x1f, 0x40, 0x1f, 0x41, 0, 16, 0, 0]);
    ip.extend_from_slice(b"INJECTED");
    f.extend_from_slice(&ip);
    f
}

/// Seconds rank 0 counts its NIC's frames over, while the test forges datagrams.
const WINDOW: u64 = 12;

#[test]
fn no_wildcard_listener_and_no_injected_frame_reaches_a_guest() {
    if !vm_tools() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !testkit::require(root, "root", "run as root (raw sockets, /proc/<pid>/fd)") {
        return;
    }
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let tmp = tempfile::tempdir().unwrap();
    let rx = "$(cat /sys/class/net/eth0/statistics/rx_packets)";
    let script = format!(
        r#"
        if [ "$VSE_RANK" = 0 ]; then
            busybox nc -l -p 7000
            sleep 3; echo rx0={rx}
            sleep {WINDOW}; echo rx1={rx}
        else
            i=0
            until echo hello-from-1 | busybox nc 10.20.0.2 7000; do
                i=$((i+1)); [ $i -gt 600 ] && {{ echo no route to rank 0 >&2; exit 9; }}
                sleep 0.2
            done
            sleep $(({WINDOW} + 8))
        fi
    "#
    );
    let policy = support::specs().join("site.policy.yaml");
    let mut child = Command::new(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "local:2", "--policy"])
        .arg(&policy)
        .args(["--", "sh", "-c", &script])
        .env("VSE_IMAGE_CACHE", tmp.path().join("cache"))
        .env("VSE_RUN_DIR", tmp.path().join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = |prefix: &str| -> String {
        loop {
            let l = lines
                .recv_timeout(Duration::from_secs(900))
                .unwrap_or_else(|_| panic!("no {prefix:?} line; so far: {seen:?}"));
            seen.push(l.clone());
            if let Some(v) = l.strip_prefix(prefix) {
                return v.to_string();
            }
        }
    };
    let hello = wait_for("[rank 0] ");
    assert_eq!(hello, "hello-from-1", "the ranks' own traffic");
    let rx0: u64 = wait_for("[rank 0] rx0=").parse().unwrap();
    let window = std::time::Instant::now();

    // The job's processes and their sockets, while the job runs.
    let procs = tree(child.id());
    let table = sockets();
    let mut owned: Vec<(u32, String, Sock)> = Vec::new();
    for (pid, name) in &procs {
        for ino in socket_inodes(*pid) {
            if let Some(s) = table.get(&ino) {
                owned.push((*pid, name.clone(), s.clone()));
            }
        }
    }
    eprintln!("job sockets: {owned:#?}");
    assert!(
        procs.iter().filter(|(_, n)| n.starts_with("qemu")).count() == 2,
        "{procs:?}"
    );
    let wild: Vec<_> = owned.iter().filter(|(_, _, s)| s.wildcard).collect();
    assert!(
        wild.is_empty(),
        "wildcard sockets while the job runs: {wild:#?}"
    );

    // Targets: the front-end's switch (its UDP socket) and every UDP socket connected to it
    // (the nodes' uplinks). Forged sources: every UDP endpoint of the job.
    let udp: Vec<(u32, SocketAddrV4, SocketAddrV4)> = owned
        .iter()
        .filter_map(|(pid, _, s)| s.v4.map(|(l, r)| (*pid, l, r)))
        .collect();
    let switch: Vec<SocketAddrV4> = udp
        .iter()
        .filter(|(pid, _, r)| *pid == child.id() && r.port() == 0)
        .map(|(_, l, _)| *l)
        .collect();
    assert_eq!(switch.len(), 1, "the front-end's switch: {udp:?}");
    let mut targets = switch.clone();
    targets.extend(
        udp.iter()
            .filter(|(_, _, r)| *r == switch[0])
            .map(|(_, l, _)| *l),
    );
    // SAFETY: plain socket creation.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(raw >= 0, "{}", std::io::Error::last_os_error());
    let frame = frame_to_rank0();
    let mut sent = 0;
    for _ in 0..100 {
        for t in &targets {
            for (_, src, _) in &udp {
                if src != t {
                    send_forged(raw, *src, *t, &frame);
                    sent += 1;
                }
            }
        }
    }
    // SAFETY: closing the socket made above.
    unsafe { libc::close(raw) };
    eprintln!("forged {sent} datagrams at {targets:?}");
    // Forged frames that came after rank 0 counted again would prove nothing.
    assert!(
        window.elapsed() < Duration::from_secs(WINDOW - 2),
        "the forging took {:?}, past rank 0's {WINDOW} s window",
        window.elapsed()
    );

    let rx1: u64 = wait_for("[rank 0] rx1=").parse().unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    accel_note(&tmp.path().join("run"));
    assert_eq!(o.status.code(), Some(0), "{err}");
    // A few frames of the ranks' own (ARP, TCP teardown) may still arrive; the forged ones
    // would be hundreds.
    assert!(
        rx1 - rx0 < 20,
        "rank 0's NIC received {} frames while {sent} forged datagrams were sent",
        rx1 - rx0
    );
    no_qemu_left(&tmp.path().join("run"));
}

/// A front-end told to listen on every interface is refused before anything starts.
#[test]
fn a_wildcard_listen_address_is_refused() {
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    for any in ["0.0.0.0", "::"] {
        let o = Command::new(VSE)
            .arg("launch")
            .arg(&img)
            .args(["--allocation", "local:1", "--listen", any, "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{any}: {err}");
        assert!(err.contains("wildcard"), "{any}: {err}");
    }
}
