//! A small typed QMP client over the unix socket: greeting, capabilities negotiation, then
//! synchronous commands. Asynchronous events between replies are skipped (state is queried).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
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
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(QmpError::Disconnected("QMP socket closed".into())),
            Ok(_) => serde_json::from_str(&line)
                .map_err(|e| QmpError::Protocol(format!("{e}: {}", line.trim()))),
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
