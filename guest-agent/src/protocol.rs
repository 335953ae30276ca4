//! Host ↔ guest protocol: one JSON object per line, each request carrying an id that its
//! response repeats. The guest speaks first with [`Message::Ready`].

use std::collections::BTreeMap;

/// Bumped on incompatible changes; both sides check it in `Ready`.
pub const PROTOCOL_VERSION: u32 = 1;
/// The virtio-serial port name QEMU exposes to the guest (`/sys/class/virtio-ports/*/name`).
pub const PORT_NAME: &str = "org.vse.agent.0";
/// The unix socket inside the guest where ranks reach the barrier relay
/// (`VSE_BARRIER_SOCKET` for the barrier library).
pub const GUEST_BARRIER_SOCKET: &str = "/run/vse-barrier.sock";
/// Largest `data` of one [`Message::Output`] chunk, in bytes (a line of JSON stays small
/// whatever the command writes).
pub const MAX_CHUNK: usize = 16 * 1024;

/// Which output of a command a chunk comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// Who a command runs as in the guest: the job's user on the host, taken from the host's
/// account when the command is asked for (never from the image). The agent adds the account
/// to the guest's `/etc/passwd` and `/etc/group` when the image lacks it, makes its home, and
/// starts the command with these ids, `HOME`, `USER` and `LOGNAME`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuestUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, as the job has them on the host.
    #[serde(default)]
    pub groups: Vec<u32>,
    pub name: String,
    /// The name of group `gid`.
    pub group: String,
    pub home: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Run `argv` (no shell), wait, return its output and status.
    Exec {
        id: u64,
        argv: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        cwd: Option<String>,
        #[serde(default)]
        stdin: Option<String>,
        /// Run as this user (without: as the agent, root). Agents older than this field
        /// ignore it and run the command as root.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<GuestUser>,
        /// The command's standard input comes in [`Request::Stdin`] chunks (instead of
        /// `stdin`, or nothing).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin_stream: bool,
    },
    /// Like `Exec`, but the output travels while the command runs: [`Message::Output`] chunks
    /// (at most [`MAX_CHUNK`] bytes each, stdout and stderr separately), then `Exited` with
    /// empty `stdout`/`stderr`. Agents older than this request answer `Error` with id 0.
    ExecStream {
        id: u64,
        argv: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        cwd: Option<String>,
        #[serde(default)]
        stdin: Option<String>,
        /// Run as this user (without: as the agent, root). Agents older than this field
        /// ignore it and run the command as root.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<GuestUser>,
        /// The command's standard input comes in [`Request::Stdin`] chunks (instead of
        /// `stdin`, or nothing).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin_stream: bool,
    },
    /// Configure the job network: the NIC with `mac` gets `ip`/`prefix`, loopback comes up,
    /// the hostname becomes `hostname` and `/etc/hosts` lists `hosts`. Replies `Ok`.
    NetConfig {
        id: u64,
        mac: String,
        ip: std::net::Ipv4Addr,
        prefix: u8,
        hostname: String,
        hosts: Vec<(String, std::net::Ipv4Addr)>,
        /// The job's guest key (hex): when set, the agent serves `rsh` on its job address
        /// and its own `vse-agent rsh` clients use the key (see [`crate::rsh`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rsh_key: Option<String>,
        /// Environment of the commands the rsh service starts (MPI daemons, and through them
        /// the ranks): who this VM is to the barrier hook.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        rsh_env: BTreeMap<String, String>,
        /// Who the commands the rsh service starts run as (the job's user), and who may read
        /// the guest key for its own `vse-agent rsh` clients.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rsh_user: Option<GuestUser>,
    },
    /// A guest restored from a boot template takes its own identity: `entropy` (hex, at least
    /// 32 bytes) is mixed into the kernel's pool and the CRNG reseeded, `/etc/machine-id`
    /// becomes `machine_id`, the hostname `hostname`, the clock `time_unix_ns`, and with `mac`
    /// the NIC takes that MAC (the saved state carries the template VM's). Replies `Ok`.
    /// Agents older than this request answer `Error` with id 0 (the host then boots cold).
    Reidentify {
        id: u64,
        hostname: String,
        machine_id: String,
        entropy: String,
        time_unix_ns: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
    /// A chunk of the standard input of command `exec` (started with `stdin_stream`): `data`
    /// (hex) is the input from byte `offset` on; `eof` closes it after this chunk. Replies
    /// `Ok` once written (a chunk sent again is written only past what was), `Error` when the
    /// command no longer reads its input.
    Stdin {
        id: u64,
        exec: u64,
        offset: u64,
        data: String,
        #[serde(default)]
        eof: bool,
    },
    /// Guest `/proc/meminfo` and `/proc/stat`, for monitoring the guest's own view.
    Sample { id: u64 },
    /// Sync disks and power off.
    Shutdown { id: u64 },
    /// A line from the controller's barrier server for the guest rank on connection `conn`
    /// (NOTICE, ACK). No reply.
    Barrier { conn: u64, line: String },
    /// The controller side of `conn` closed: the guest rank sees end-of-file. No reply.
    BarrierClose { conn: u64 },
    /// Mount these host directories (see [`crate::share`]); a share mounted already stays.
    /// Replies `Ok`. Agents older than this request answer `Error` with id 0.
    Mount {
        id: u64,
        shares: Vec<crate::share::proto::MountShare>,
    },
    /// A new host end took over: the guest sends every share operation still unanswered
    /// again (marked retry), to it. No reply.
    FsResend,
    /// The host's answer to the guest's share operation `req` ([`Message::Fs`]), followed by
    /// `bytes` bytes of payload whose [`crate::share::proto::checksum`] is `sum`. No reply.
    FsReply {
        req: u64,
        result: crate::share::proto::FsResult,
        #[serde(default, skip_serializing_if = "crate::share::proto::is_zero")]
        bytes: u32,
        #[serde(default, skip_serializing_if = "crate::share::proto::is_zero")]
        sum: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Message {
    Ready {
        version: u32,
        kernel: String,
    },
    Exited {
        id: u64,
        /// Exit code, or 128 + signal number.
        status: i32,
        stdout: String,
        stderr: String,
    },
    /// A chunk of a streamed command's output (`ExecStream`), in the order it was written.
    /// Chunks end on UTF-8 character boundaries, not on lines.
    Output {
        id: u64,
        stream: OutStream,
        data: String,
    },
    Sample {
        id: u64,
        meminfo: String,
        stat: String,
    },
    Ok {
        id: u64,
    },
    Error {
        id: u64,
        message: String,
    },
    /// Unsolicited: a guest rank on connection `conn` wrote `line` (HELLO, READY) on the
    /// guest's barrier socket; the host relays it to the controller's barrier server.
    Barrier {
        conn: u64,
        line: String,
    },
    /// Unsolicited: the guest rank on `conn` closed its barrier connection.
    BarrierClosed {
        conn: u64,
    },
    /// Unsolicited: a file operation on share `share`, for the host to do and answer with
    /// [`Request::FsReply`], followed by `bytes` bytes of payload (a write's data).
    /// `retry`: sent before, to a host end that may have done it.
    Fs {
        req: u64,
        share: u32,
        op: crate::share::proto::FsOp,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        retry: bool,
        #[serde(default, skip_serializing_if = "crate::share::proto::is_zero")]
        bytes: u32,
    },
}

impl Message {
    pub fn id(&self) -> Option<u64> {
        match self {
            Message::Ready { .. }
            | Message::Barrier { .. }
            | Message::BarrierClosed { .. }
            | Message::Fs { .. } => None,
            Message::Exited { id, .. }
            | Message::Output { id, .. }
            | Message::Sample { id, .. }
            | Message::Ok { id }
            | Message::Error { id, .. } => Some(*id),
        }
    }
}

/// Bytes as lowercase hex, as binary fields travel in this protocol (share data included:
/// by table, since every byte a job writes to a share passes here twice).
pub fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(b.len() * 2);
    for x in b {
        out.push(DIGITS[usize::from(x >> 4)]);
        out.push(DIGITS[usize::from(x & 15)]);
    }
    // Only ASCII digits were pushed.
    String::from_utf8(out).unwrap_or_default()
}

/// The bytes of a hex field (`None` for anything but pairs of hex digits).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Reads the next chunk of a command's standard input into `buf`: its length, 0 at the end
/// (an input that fails ends like one that ends; an interrupted read is retried).
pub fn read_chunk(input: &mut impl std::io::Read, buf: &mut [u8]) -> usize {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r.unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod hex_tests {
    use super::{hex, unhex};

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let all: Vec<u8> = (0..=255).collect();
        let h = hex(&all);
        assert!(h.starts_with("000102") && h.ends_with("fdfeff"));
        assert_eq!(unhex(&h).unwrap(), all);
        assert_eq!(unhex("0A").unwrap(), [10]);
        for bad in ["0", "0g", "zz", "é1"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }
}
