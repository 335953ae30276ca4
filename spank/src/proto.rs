//! Task client ↔ node service, over the step's unix socket: one JSON object per line. The
//! client sends one [`ExecRequest`]; the service answers with output chunks as the command
//! writes them, then exactly one `exited` or `failed`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use vse_guest_agent::protocol::OutStream;

/// The socket's name in the step directory.
pub const SOCKET: &str = "node.sock";
/// The service's pid file in the step directory.
pub const PID_FILE: &str = "node.pid";
/// Longest request line accepted (a task's environment can be large, not unbounded).
pub const MAX_REQUEST: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The task's working directory (the guest's `/` when the VM has no such directory).
    pub cwd: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Reply {
    Output {
        stream: OutStream,
        data: String,
    },
    /// The command's status: its exit code, or 128 + the signal that ended it.
    Exited {
        status: i32,
    },
    /// The command could not run; `invalid`: because of the user's request (exit code 2).
    Failed {
        message: String,
        invalid: bool,
    },
}

/// Writes one message as a line.
pub fn send<T: Serialize>(mut w: impl Write, m: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Reads one message; `Ok(None)` at end of file. A line longer than `max` is an error.
pub fn recv<T: for<'de> Deserialize<'de>>(
    r: &mut impl BufRead,
    max: u64,
) -> std::io::Result<Option<T>> {
    let mut line = Vec::new();
    let n = r.by_ref().take(max + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("message longer than {max} bytes"),
        ));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_lines() {
        let mut buf = Vec::new();
        let req = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "echo \"$X\"\n".into()],
            env: [("X".to_string(), "a\nb".to_string())].into(),
            cwd: "/tmp".into(),
        };
        send(&mut buf, &req).unwrap();
        send(&mut buf, &Reply::Exited { status: 7 }).unwrap();
        let mut r = std::io::BufReader::new(&buf[..]);
        assert_eq!(recv::<ExecRequest>(&mut r, 1024).unwrap(), Some(req));
        assert_eq!(
            recv::<Reply>(&mut r, 1024).unwrap(),
            Some(Reply::Exited { status: 7 })
        );
        assert_eq!(recv::<Reply>(&mut r, 1024).unwrap(), None);
    }

    #[test]
    fn oversized_lines_are_refused() {
        let line = format!("{{\"argv\":[\"{}\"]}}\n", "x".repeat(100));
        let mut r = std::io::BufReader::new(line.as_bytes());
        assert!(recv::<ExecRequest>(&mut r, 50).is_err());
    }
}
