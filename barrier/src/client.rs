//! The rank side of the barrier channel. When no notice is pending a check costs one
//! non-blocking `recv` on an already open socket: no file, no semaphore, no round trip.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("environment variable {name} is {problem}; expected {expected}")]
    Env {
        name: &'static str,
        problem: String,
        expected: &'static str,
    },
    #[error("cannot connect to barrier channel {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("barrier channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("barrier channel: unexpected message `{0}`")]
    Protocol(String),
}

/// What a barrier check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// No notice: go on.
    Go,
    /// This rank blocked while its VM was migrated.
    Migrated,
    /// This rank blocked; the notice was cancelled, failed, or the controller went away.
    Released,
}

pub struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
    notice: Option<i64>,
    closed: bool,
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
}

impl Client {
    pub fn connect(socket: &Path, job: &str, vm: &str, rank: u32) -> Result<Self, BarrierError> {
        for (name, v) in [("VSE_JOB_ID", job), ("VSE_VM_ID", vm)] {
            if !valid_id(v) {
                return Err(BarrierError::Env {
                    name,
                    problem: format!("`{v}`"),
                    expected: "1-128 characters from [A-Za-z0-9._:@-]",
                });
            }
        }
        let mut stream = UnixStream::connect(socket).map_err(|source| BarrierError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
        stream.write_all(format!("HELLO {job} {vm} {rank}\n").as_bytes())?;
        Ok(Self {
            stream,
            buf: Vec::new(),
            notice: None,
            closed: false,
        })
    }

    /// Connects as described by the environment; `Ok(None)` when not running under vse.
    pub fn from_env() -> Result<Option<Self>, BarrierError> {
        let Some(socket) = std::env::var_os("VSE_BARRIER_SOCKET") else {
            return Ok(None);
        };
        let get = |name: &'static str| {
            std::env::var(name).map_err(|_| BarrierError::Env {
                name,
                problem: "not set".into(),
                expected: "the id vse exports into the VM",
            })
        };
        let job = get("VSE_JOB_ID")?;
        let vm = get("VSE_VM_ID")?;
        let rank_var = [
            "VSE_RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "SLURM_PROCID",
        ]
        .into_iter()
        .find_map(|n| std::env::var(n).ok().map(|v| (n, v)));
        let rank = match rank_var {
            None => 0,
            Some((name, v)) => v.parse().map_err(|_| BarrierError::Env {
                name: "VSE_RANK",
                problem: format!("`{v}` (from {name})"),
                expected: "a non-negative integer",
            })?,
        };
        Self::connect(Path::new(&socket), &job, &vm, rank).map(Some)
    }

    /// Parses complete lines in the buffer; returns an ACK outcome if one arrived.
    fn drain_lines(&mut self) -> Result<Option<String>, BarrierError> {
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line).trim().to_string();
            let mut parts = line.split_whitespace();
            match (
                parts.next(),
                parts.next().and_then(|s| s.parse::<i64>().ok()),
            ) {
                (Some("NOTICE"), Some(id)) => self.notice = Some(id),
                (Some("ACK"), Some(id)) => {
                    if self.notice == Some(id) {
                        self.notice = None;
                        return Ok(Some(parts.next().unwrap_or("").to_string()));
                    }
                }
                _ => return Err(BarrierError::Protocol(line)),
            }
        }
        Ok(None)
    }

    fn read_some(&mut self, blocking: bool) -> Result<bool, BarrierError> {
        self.stream.set_nonblocking(!blocking)?;
        let mut chunk = [0u8; 256];
        match self.stream.read(&mut chunk) {
            Ok(0) => {
                self.closed = true;
                Ok(false)
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Called at every barrier.
    pub fn check(&mut self) -> Result<Check, BarrierError> {
        if self.closed {
            return Ok(Check::Go);
        }
        while self.read_some(false)? {}
        self.drain_lines()?;
        let Some(id) = self.notice else {
            return Ok(Check::Go);
        };
        self.stream.set_nonblocking(false)?;
        self.stream.write_all(format!("READY {id}\n").as_bytes())?;
        loop {
            if let Some(outcome) = self.drain_lines()? {
                return Ok(if outcome == "migrated" {
                    Check::Migrated
                } else {
                    Check::Released
                });
            }
            if self.closed {
                // The controller died: its successor rolls the notice back, so go on.
                self.notice = None;
                return Ok(Check::Released);
            }
            self.read_some(true)?;
        }
    }
}
