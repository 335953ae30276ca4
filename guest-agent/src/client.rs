//! The host side: wait for `Ready`, send requests, read their replies.

use crate::protocol::{Message, OutStream, PROTOCOL_VERSION, Request};
use std::io::{BufRead, BufReader, Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("agent channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent channel closed before {0}")]
    Closed(&'static str),
    #[error("agent sent an invalid message {line:?}: {message}")]
    Bad { line: String, message: String },
    #[error(
        "guest agent speaks protocol {0}, this vse speaks {PROTOCOL_VERSION}; rebuild the image"
    )]
    Version(u32),
    #[error("guest agent: {0}")]
    Agent(String),
}

/// Result of a command run in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

pub struct Client<R: Read, W: Write> {
    reader: BufReader<R>,
    writer: W,
    next_id: u64,
    /// The guest kernel's release, from `Ready`.
    pub kernel: String,
}

impl<R: Read, W: Write> Client<R, W> {
    /// Blocks until the agent announces itself (set a read timeout on `reader` to bound it).
    pub fn connect(reader: R, writer: W) -> Result<Self, ClientError> {
        let mut c = Client {
            reader: BufReader::new(reader),
            writer,
            next_id: 1,
            kernel: String::new(),
        };
        match c.read("the agent was ready")? {
            Message::Ready { version, kernel } if version == PROTOCOL_VERSION => {
                c.kernel = kernel;
                Ok(c)
            }
            Message::Ready { version, .. } => Err(ClientError::Version(version)),
            other => Err(ClientError::Agent(format!("expected ready, got {other:?}"))),
        }
    }

    fn read(&mut self, what: &'static str) -> Result<Message, ClientError> {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(ClientError::Closed(what));
            }
            // A virtio-serial port can carry noise from before the agent opened it.
            let t = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
            if !t.starts_with('{') {
                continue;
            }
            return serde_json::from_str(t).map_err(|e| ClientError::Bad {
                line: t.to_string(),
                message: e.to_string(),
            });
        }
    }

    fn send(&mut self, r: &Request) -> Result<(), ClientError> {
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        self.writer.flush()?;
        Ok(())
    }

    fn call(&mut self, make: impl FnOnce(u64) -> Request) -> Result<Message, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&make(id))?;
        loop {
            let m = self.read("the reply")?;
            if m.id() == Some(id) || m.id() == Some(0) {
                if let Message::Error { message, .. } = m {
                    return Err(ClientError::Agent(message));
                }
                return Ok(m);
            }
        }
    }

    pub fn exec(&mut self, argv: &[&str]) -> Result<ExecOutput, ClientError> {
        let argv = argv.iter().map(|s| s.to_string()).collect();
        match self.call(|id| Request::Exec {
            id,
            argv,
            env: Default::default(),
            cwd: None,
            stdin: None,
        })? {
            Message::Exited {
                status,
                stdout,
                stderr,
                ..
            } => Ok(ExecOutput {
                status,
                stdout,
                stderr,
            }),
            other => Err(ClientError::Agent(format!("unexpected reply {other:?}"))),
        }
    }

    /// Runs `argv` with `env`, handing its output to `on_output` while it runs; returns the
    /// exit status. An agent from before streaming existed gets a plain `exec`, and its whole
    /// output arrives at the end.
    pub fn exec_stream(
        &mut self,
        argv: &[&str],
        env: &std::collections::BTreeMap<String, String>,
        mut on_output: impl FnMut(OutStream, &str),
    ) -> Result<i32, ClientError> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let id = self.next_id;
        self.next_id += 1;
        self.send(&Request::ExecStream {
            id,
            argv: argv.clone(),
            env: env.clone(),
            cwd: None,
            stdin: None,
        })?;
        loop {
            match self.read("the command's exit")? {
                Message::Output {
                    id: i,
                    stream,
                    data,
                } if i == id => on_output(stream, &data),
                Message::Exited { id: i, status, .. } if i == id => return Ok(status),
                Message::Error { id: i, message } if i == id => {
                    return Err(ClientError::Agent(message));
                }
                Message::Error { id: 0, message } if message.contains("exec-stream") => {
                    return self.exec_collected(argv, env, on_output);
                }
                Message::Error { id: 0, message } => return Err(ClientError::Agent(message)),
                _ => {}
            }
        }
    }

    fn exec_collected(
        &mut self,
        argv: Vec<String>,
        env: &std::collections::BTreeMap<String, String>,
        mut on_output: impl FnMut(OutStream, &str),
    ) -> Result<i32, ClientError> {
        match self.call(|id| Request::Exec {
            id,
            argv,
            env: env.clone(),
            cwd: None,
            stdin: None,
        })? {
            Message::Exited {
                status,
                stdout,
                stderr,
                ..
            } => {
                for (s, d) in [(OutStream::Stdout, stdout), (OutStream::Stderr, stderr)] {
                    if !d.is_empty() {
                        on_output(s, &d);
                    }
                }
                Ok(status)
            }
            other => Err(ClientError::Agent(format!("unexpected reply {other:?}"))),
        }
    }

    /// Gives the guest its address on the job network (see [`Request::NetConfig`]).
    pub fn net_config(
        &mut self,
        mac: &str,
        ip: std::net::Ipv4Addr,
        prefix: u8,
        hostname: &str,
        hosts: &[(String, std::net::Ipv4Addr)],
        rsh_key: Option<&str>,
    ) -> Result<(), ClientError> {
        self.call(|id| Request::NetConfig {
            id,
            mac: mac.into(),
            ip,
            prefix,
            hostname: hostname.into(),
            hosts: hosts.to_vec(),
            rsh_key: rsh_key.map(str::to_string),
        })
        .map(|_| ())
    }

    /// Blocks until the channel closes (the VM stopped), ignoring what the guest sends.
    pub fn wait_closed(&mut self) {
        // A garbled line is no reason to give up the VM while rank 0 still uses it.
        while let Ok(_) | Err(ClientError::Bad { .. }) = self.read("the end") {}
    }

    /// (`/proc/meminfo`, `/proc/stat`) of the guest.
    pub fn sample(&mut self) -> Result<(String, String), ClientError> {
        match self.call(|id| Request::Sample { id })? {
            Message::Sample { meminfo, stat, .. } => Ok((meminfo, stat)),
            other => Err(ClientError::Agent(format!("unexpected reply {other:?}"))),
        }
    }

    pub fn shutdown(&mut self) -> Result<(), ClientError> {
        self.call(|id| Request::Shutdown { id }).map(|_| ())
    }
}
