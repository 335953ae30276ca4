//! `vse-agent rsh HOST CMD...`: an rsh agent for Open MPI (`plm_rsh_agent`) that needs no
//! sshd. It connects to HOST's guest agent on the job's private network, proves it knows the
//! job's guest key, and runs CMD there the way ssh does (`sh -c "CMD..."`), relaying the
//! output and exit status.
//!
//! The key reaches each guest agent from its host over virtio-serial (`net-config`) and
//! never travels on the network: each connection answers a fresh nonce with
//! HMAC-SHA256(key, nonce ‖ command), so a captured exchange cannot be replayed or altered.
//! The listener is bound to the VM's job address only.

use crate::exec::ExecCmd;
use crate::protocol::{GuestUser, Message, OutStream};
use crate::sync::lock;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a peer VM may take to answer: every VM boots and configures its NIC on its own,
/// so mpirun on the first one can ask before the others are on the job network.
const PEER_WAIT: Duration = Duration::from_secs(300);

/// TCP port of the rsh service on each VM's job address.
pub const RSH_PORT: u16 = 7022;
/// Where the guest keeps the job's key for its own `rsh` clients (mode 0600).
pub const KEY_FILE: &str = "/run/vse-rsh.key";

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Hello {
    nonce: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct RshRequest {
    /// The remote command line (ssh semantics: run by `sh -c`).
    command: String,
    /// Hex HMAC-SHA256(key, nonce ‖ "\n" ‖ command).
    mac: String,
}

pub(crate) use crate::protocol::{hex, unhex};

fn mac_of(key: &[u8], nonce: &str, command: &str) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(nonce.as_bytes());
    m.update(b"\n");
    m.update(command.as_bytes());
    m
}

fn random_nonce() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    // SAFETY: writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(hex(&b))
}

fn line<T: serde::Serialize>(w: &mut impl Write, v: &T) -> std::io::Result<()> {
    let mut l = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    l.push(b'\n');
    w.write_all(&l)?;
    w.flush()
}

/// Serves rsh connections on `addr` (a background thread per connection) until the process
/// ends. `key` is the job's guest key.
pub fn listen(
    addr: SocketAddr,
    key: Vec<u8>,
    env: std::collections::BTreeMap<String, String>,
    user: Option<GuestUser>,
) -> std::io::Result<()> {
    let l = TcpListener::bind(addr)?;
    let (key, run) = (Arc::new(key), Arc::new((env, user)));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let (key, run) = (key.clone(), run.clone());
            std::thread::spawn(move || {
                let _ = serve_one(s, &key, &run.0, &run.1);
            });
        }
    });
    Ok(())
}

fn serve_one(
    s: TcpStream,
    key: &[u8],
    env: &std::collections::BTreeMap<String, String>,
    user: &Option<GuestUser>,
) -> std::io::Result<()> {
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s.try_clone()?);
    let nonce = random_nonce()?;
    line(
        &mut w,
        &Hello {
            nonce: nonce.clone(),
        },
    )?;
    // An unauthenticated peer gets a short time to answer, then is dropped.
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = String::new();
    r.read_line(&mut req)?;
    let req: RshRequest = serde_json::from_str(req.trim()).map_err(std::io::Error::other)?;
    let ok =
        unhex(&req.mac).is_some_and(|m| mac_of(key, &nonce, &req.command).verify_slice(&m).is_ok());
    if !ok {
        return line(
            &mut w,
            &Message::Error {
                id: 0,
                message: "rsh: authentication failed".into(),
            },
        );
    }
    s.set_read_timeout(None)?;
    let cmd = ExecCmd {
        id: 0,
        argv: vec!["sh".into(), "-c".into(), req.command],
        env: env.clone(),
        cwd: None,
        stdin: None,
        user: user.clone(),
        feed: None,
    };
    let out = Mutex::new(w.try_clone()?);
    let (done, pgid) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI32::new(0)),
    );
    // The client going away (mpirun ending, a killed orted launch) ends the command and
    // everything it started, as sshd does when the connection drops.
    let (d, p) = (done.clone(), pgid.clone());
    std::thread::spawn(move || {
        let mut sink = String::new();
        while matches!(r.read_line(&mut sink), Ok(n) if n > 0) {
            sink.clear();
        }
        let g = p.load(Ordering::SeqCst);
        if !d.load(Ordering::SeqCst) && g > 0 {
            // SAFETY: signals the command's own process group.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
    });
    let end = cmd.stream_in_group(
        &|m| {
            let mut o = lock(&out);
            let _ = line(&mut *o, &m);
        },
        &|pid| pgid.store(pid as i32, Ordering::SeqCst),
    );
    done.store(true, Ordering::SeqCst);
    line(&mut w, &end)
}

/// The address of `host`: an IPv4 literal, or its line in `hosts` (the guest's /etc/hosts,
/// which the host wrote: no resolver library needed in the static agent).
pub fn resolve(host: &str, hosts: &str) -> Option<Ipv4Addr> {
    if let Ok(ip) = host.parse() {
        return Some(ip);
    }
    hosts.lines().find_map(|l| {
        let l = l.split('#').next()?;
        let mut f = l.split_whitespace();
        let ip: Ipv4Addr = f.next()?.parse().ok()?;
        f.any(|n| n == host).then_some(ip)
    })
}

/// `vse-agent rsh [-opts] HOST CMD...`: returns the remote command's exit status (255 when
/// it could not be run, as ssh does).
pub fn client_main(args: &[String]) -> i32 {
    // Options an rsh caller may pass (e.g. -x, -n) have no meaning here.
    let rest: Vec<&String> = args.iter().skip_while(|a| a.starts_with('-')).collect();
    let Some((host, cmd)) = rest.split_first() else {
        eprintln!("usage: vse-agent rsh HOST COMMAND...");
        return 255;
    };
    let command = cmd.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ");
    match run_remote(host, &command, Path::new(KEY_FILE), Path::new("/etc/hosts")) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vse-agent rsh {host}: {e}");
            255
        }
    }
}

/// Why `vse-agent rsh` could not run a command or learn its status.
#[derive(Debug, thiserror::Error)]
pub enum RshError {
    #[error("no job key in {} (is the job network up?)", .0.display())]
    NoKey(PathBuf),
    #[error("unknown host (not in {})", .0.display())]
    UnknownHost(PathBuf),
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("bad greeting: {0}")]
    Greeting(#[source] serde_json::Error),
    #[error("bad message: {0}")]
    Message(#[source] serde_json::Error),
    #[error("connection closed before the command's exit status")]
    Closed,
    /// The serving agent's own error message.
    #[error("{0}")]
    Remote(String),
}

/// Runs `command` on `host` and relays its output to this process's stdout and stderr.
pub fn run_remote(
    host: &str,
    command: &str,
    key_file: &Path,
    hosts_file: &Path,
) -> Result<i32, RshError> {
    let key = std::fs::read_to_string(key_file)
        .ok()
        .and_then(|k| unhex(k.trim()))
        .ok_or_else(|| RshError::NoKey(key_file.to_path_buf()))?;
    let hosts = std::fs::read_to_string(hosts_file).unwrap_or_default();
    let ip =
        resolve(host, &hosts).ok_or_else(|| RshError::UnknownHost(hosts_file.to_path_buf()))?;
    let addr = SocketAddr::new(IpAddr::V4(ip), RSH_PORT);
    let s = connect(addr, Instant::now() + PEER_WAIT)
        .map_err(|source| RshError::Connect { addr, source })?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut l = String::new();
    r.read_line(&mut l)?;
    let hello: Hello = serde_json::from_str(l.trim()).map_err(RshError::Greeting)?;
    let mac = hex(&mac_of(&key, &hello.nonce, command).finalize().into_bytes());
    line(
        &mut w,
        &RshRequest {
            command: command.into(),
            mac,
        },
    )?;
    loop {
        l.clear();
        if r.read_line(&mut l)? == 0 {
            return Err(RshError::Closed);
        }
        match serde_json::from_str::<Message>(l.trim()).map_err(RshError::Message)? {
            Message::Output { stream, data, .. } => {
                let _ = match stream {
                    OutStream::Stdout => {
                        let mut o = std::io::stdout().lock();
                        o.write_all(data.as_bytes()).and_then(|_| o.flush())
                    }
                    OutStream::Stderr => std::io::stderr().write_all(data.as_bytes()),
                };
            }
            Message::Exited { status, .. } => return Ok(status),
            Message::Error { message, .. } => return Err(RshError::Remote(message)),
            _ => {}
        }
    }
}

/// Connects to `addr`, retrying while the peer is not there yet (its address not answering
/// ARP, or its rsh service not listening) until `deadline`; other errors are final.
fn connect(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    let mut pause = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.clamp(Duration::from_millis(1), Duration::from_secs(30));
        match TcpStream::connect_timeout(&addr, attempt) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() + pause < deadline && not_there_yet(&e) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

fn not_there_yet(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ECONNREFUSED | libc::ETIMEDOUT)
    ) || e.kind() == std::io::ErrorKind::TimedOut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_from_the_hosts_file() {
        let h = "127.0.0.1\tlocalhost\n10.251.0.2\tj-r0\n10.251.0.3\tj-r1 alias # c\n";
        assert_eq!(resolve("j-r1", h), Some(Ipv4Addr::new(10, 251, 0, 3)));
        assert_eq!(resolve("alias", h), Some(Ipv4Addr::new(10, 251, 0, 3)));
        assert_eq!(resolve("10.1.2.3", h), Some(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(resolve("nope", h), None);
    }

    /// A peer whose service comes up late is waited for; one that never does is given up
    /// on at the deadline with the connection's own error.
    #[test]
    fn connecting_waits_for_a_peer_still_starting() {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            let l = TcpListener::bind(addr).unwrap();
            l.accept().unwrap();
        });
        connect(addr, Instant::now() + Duration::from_secs(20)).unwrap();
        late.join().unwrap();
        let t0 = Instant::now();
        let e = connect(addr, t0 + Duration::from_millis(500)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// A real round trip on loopback: output, status, and a wrong key refused.
    #[test]
    fn authenticated_remote_command() {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        listen(addr, b"job-key".to_vec(), Default::default(), None).unwrap();
        let dir = std::env::temp_dir().join(format!("vse-rsh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, hex(b"job-key")).unwrap();
        let last_mac = Mutex::new(String::new());
        let run = |cmd: &str, key: &Path, replay: bool| {
            let s = TcpStream::connect(addr).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            let hello: Hello = serde_json::from_str(l.trim()).unwrap();
            let k = unhex(std::fs::read_to_string(key).unwrap().trim()).unwrap();
            let mut mac = hex(&mac_of(&k, &hello.nonce, cmd).finalize().into_bytes());
            let mut last = last_mac.lock().unwrap();
            if replay {
                mac = last.clone();
            }
            *last = mac.clone();
            drop(last);
            line(
                &mut w,
                &RshRequest {
                    command: cmd.into(),
                    mac,
                },
            )
            .unwrap();
            let mut msgs = Vec::new();
            loop {
                l.clear();
                if r.read_line(&mut l).unwrap() == 0 {
                    break;
                }
                let m: Message = serde_json::from_str(l.trim()).unwrap();
                let end = matches!(m, Message::Exited { .. } | Message::Error { .. });
                msgs.push(m);
                if end {
                    break;
                }
            }
            msgs
        };
        let msgs = run("echo remote $((1+2)); exit 7", &key, false);
        assert!(
            msgs.contains(&Message::Output {
                id: 0,
                stream: OutStream::Stdout,
                data: "remote 3\n".into()
            }),
            "{msgs:?}"
        );
        assert!(
            matches!(msgs.last(), Some(Message::Exited { status: 7, .. })),
            "{msgs:?}"
        );
        let bad = dir.join("bad");
        std::fs::write(&bad, hex(b"other-key")).unwrap();
        let refused = |msgs: &[Message]| matches!(msgs, [Message::Error { message, .. }] if message.contains("authentication failed"));
        let msgs = run("echo should not run", &bad, false);
        assert!(refused(&msgs), "{msgs:?}");
        // A proof captured from an earlier connection does not fit a fresh nonce.
        let ok = run("echo again; exit 7", &key, false);
        assert!(
            matches!(ok.last(), Some(Message::Exited { status: 7, .. })),
            "{ok:?}"
        );
        let msgs = run("echo again; exit 7", &key, true);
        assert!(refused(&msgs), "replayed: {msgs:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
