//! A small typed QMP client over the unix socket: greeting, capabilities negotiation, then
//! synchronous commands. Asynchronous events between replies are skipped (state is queried).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[derive(Debug)]
pub enum QmpError {
    /// The socket closed or failed: the QEMU process is probably gone.
    Disconnected(String),
    /// QEMU answered with an error object.
    Command { class: String, desc: String },
    /// Not JSON, or not the shape QMP promises.
    Protocol(String),
}

/// Longest QMP message read: QEMU's replies to what vse asks are a few KiB; a QEMU that a
/// guest took over must not make vse buffer without end.
const MAX_REPLY: usize = 4 << 20;

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects and negotiates. `timeout` bounds every later reply, so a hung QEMU cannot hang us.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| QmpError::Disconnected(format!("connect {}: {e}", path.display())))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| QmpError::Disconnected(e.to_string()))?;
        let writer = stream
            .try_clone()
            .map_err(|e| QmpError::Disconnected(e.to_string()))?;
        let mut q = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = q.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!(
                "expected the QMP greeting, got {greeting}"
            )));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        let read = (&mut self.reader)
            .take(MAX_REPLY as u64)
            .read_until(b'\n', &mut line);
        match read {
            Ok(0) => Err(QmpError::Disconnected("QMP socket closed".into())),
            Ok(n) if n == MAX_REPLY && line.last() != Some(&b'\n') => Err(QmpError::Protocol(
                format!("a QMP message longer than {MAX_REPLY} bytes: refused"),
            )),
            Ok(_) => serde_json::from_slice(&line).map_err(|e| {
                let text = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                QmpError::Protocol(format!("{e}: {}", text.trim()))
            }),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(QmpError::Disconnected(
                    "no QMP reply before the timeout".into(),
                ))
            }
            Err(e) => Err(QmpError::Disconnected(e.to_string())),
        }
    }

    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let text = message(command, arguments);
        self.writer
            .write_all(text.as_bytes())
            .map_err(|e| QmpError::Disconnected(format!("sending {command}: {e}")))?;
        self.reply()
    }

    /// Executes `command` with `fd` passed along (SCM_RIGHTS), as `getfd` needs.
    pub fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: std::os::fd::RawFd,
    ) -> Result<Value, QmpError> {
        let text = message(command, arguments);
        super::statefile::send_with_fd(&self.writer, text.as_bytes(), fd)
            .map_err(|e| QmpError::Disconnected(format!("sending {command}: {e}")))?;
        self.reply()
    }

    fn reply(&mut self) -> Result<Value, QmpError> {
        loop {
            let m = self.read_message()?;
            if m.get("event").is_some() {
                // Asynchronous events (STOP, RESUME, SHUTDOWN…): state is read with query-status instead.
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Command {
                    class: s("class"),
                    desc: s("desc"),
                });
            }
            return Err(QmpError::Protocol(format!("unexpected QMP message {m}")));
        }
    }
}

fn message(command: &str, arguments: Option<Value>) -> String {
    let mut msg = json!({ "execute": command });
    if let Some(a) = arguments {
        msg["arguments"] = a;
    }
    let mut text = msg.to_string();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_reply_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(b"{\"QMP\": {}}\n");
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut l = String::new();
            let _ = r.read_line(&mut l);
            let chunk = vec![b' '; 1 << 20];
            for _ in 0..(MAX_REPLY >> 20) + 2 {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let e = Qmp::connect(&path, Duration::from_secs(30)).err().unwrap();
        match e {
            QmpError::Protocol(m) => assert!(m.contains("longer than"), "{m}"),
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
    }
}
