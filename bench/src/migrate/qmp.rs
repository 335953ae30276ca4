//! The smallest QMP client the by-hand baseline needs: greeting, `qmp_capabilities`, then one
//! command at a time. V2M's own client is private to it on purpose: the baseline must not go
//! through vse's code.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP socket {0} did not appear within {1:?} (QEMU did not start?)")]
    NoSocket(String, Duration),
    #[error("QMP {command}: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP: unexpected message {0}")]
    Protocol(String),
}

pub(super) struct Qmp {
    path: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to `path` once QEMU has made it (up to `wait`) and negotiates.
    pub(super) fn connect(path: &Path, wait: Duration) -> Result<Qmp, QmpError> {
        let name = path.display().to_string();
        let io = |source| QmpError::Io {
            path: name.clone(),
            source,
        };
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < wait => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return Err(QmpError::NoSocket(name, wait)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut q = Qmp {
            path: name.clone(),
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = q.read()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(greeting.to_string()));
        }
        q.run("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Err(QmpError::Io {
                path: self.path.clone(),
                source: std::io::ErrorKind::UnexpectedEof.into(),
            });
        }
        serde_json::from_str(&line).map_err(|_| QmpError::Protocol(line.trim().to_string()))
    }

    /// Runs `command` with `args` and returns its `return` value; events are skipped (state is
    /// polled with query commands).
    pub(super) fn run(&mut self, command: &str, args: Value) -> Result<Value, QmpError> {
        let mut text = json!({ "execute": command, "arguments": args }).to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        loop {
            let m = self.read()?;
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                return Err(QmpError::Command {
                    command: command.into(),
                    class: s("class"),
                    desc: s("desc"),
                });
            }
            if m.get("event").is_none() {
                return Err(QmpError::Protocol(m.to_string()));
            }
        }
    }
}
