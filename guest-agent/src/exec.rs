//! Running one command for the host: either collected (`exec`, one reply at the end) or
//! streamed (`exec-stream`, output chunks as the command writes them, then the status).

use crate::account;
use crate::protocol::{GuestUser, MAX_CHUNK, Message, OutStream};
use crate::reaper::{self, Spawned};
use crate::stdin;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

pub struct ExecCmd {
    pub id: u64,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Option<String>,
    /// Who the command runs as; `None`: the agent's own root.
    pub user: Option<GuestUser>,
    /// The command's input, streamed by the host (see [`crate::stdin`]).
    pub feed: Option<Feed>,
}

/// A streamed input: its chunks and where their replies go.
pub struct Feed {
    rx: std::sync::Mutex<Option<std::sync::mpsc::Receiver<stdin::Chunk>>>,
    reply: std::sync::Arc<dyn Fn(Message) + Send + Sync>,
}

impl Feed {
    pub fn new(
        rx: std::sync::mpsc::Receiver<stdin::Chunk>,
        reply: impl Fn(Message) + Send + Sync + 'static,
    ) -> Feed {
        Feed {
            rx: std::sync::Mutex::new(Some(rx)),
            reply: std::sync::Arc::new(reply),
        }
    }
}

/// The image's `/etc/environment` (where a build writes the spec's `environment:`), as
/// `NAME="value"` lines with `\"` and `\\` escaped; a command gets these over the agent's own
/// variables and under the host's request (the job's `VSE_*` and the user's own).
fn image_environment() -> Vec<(String, String)> {
    std::fs::read_to_string("/etc/environment")
        .map(|t| parse_environment(&t))
        .unwrap_or_default()
}

fn parse_environment(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let name_ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if line.starts_with('#') || !name_ok {
            continue;
        }
        let v = match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(inner) => {
                let mut s = String::with_capacity(inner.len());
                let mut chars = inner.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => s.extend(chars.next()),
                        c => s.push(c),
                    }
                }
                s
            }
            None => v.to_string(),
        };
        out.push((k.to_string(), v));
    }
    out
}

/// Exit code, or 128 + signal number (what a shell reports).
fn status_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|n| 128 + n))
        .unwrap_or(255)
}

impl ExecCmd {
    fn error(&self, message: String) -> Message {
        Message::Error {
            id: self.id,
            message,
        }
    }

    fn spawn(&self) -> Result<Spawned, Message> {
        self.spawn_with(false)
    }

    fn spawn_with(&self, own_group: bool) -> Result<Spawned, Message> {
        let Some((prog, args)) = self.argv.split_first() else {
            return Err(self.error("empty argv".into()));
        };
        let mut cmd = Command::new(prog);
        cmd.args(args).envs(image_environment());
        if let Some(u) = &self.user {
            // Root is in every image; its account is not the job's to edit.
            if u.uid != 0 {
                account::ensure(std::path::Path::new("/"), u)
                    .map_err(|e| self.error(format!("cannot run {prog} as {}: {e}", u.name)))?;
            }
            account::run_as(&mut cmd, u);
            // The user's home unless the host asked for a directory.
            if std::path::Path::new(&u.home).is_dir() {
                cmd.current_dir(&u.home);
            }
        }
        cmd.envs(&self.env)
            .stdin(if self.stdin.is_some() || self.feed.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A directory the guest lacks (the launch directory, shared by default, where a node
        // could not see it) leaves the command where it was: the user's home.
        if let Some(d) = self
            .cwd
            .as_deref()
            .filter(|d| std::path::Path::new(d).is_dir())
        {
            cmd.current_dir(d);
        }
        if own_group {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let mut child =
            reaper::spawn(&mut cmd).map_err(|e| self.error(format!("cannot run {prog}: {e}")))?;
        // Writer threads: a command that never reads its input must not block us.
        if let Some(data) = self.stdin.clone()
            && let Some(mut pipe) = child.child.stdin.take()
        {
            std::thread::spawn(move || {
                let _ = pipe.write_all(data.as_bytes());
            });
        }
        if let Some(f) = &self.feed
            && let Some(rx) = f.rx.lock().ok().and_then(|mut r| r.take())
            && let Some(pipe) = child.child.stdin.take()
        {
            let reply = f.reply.clone();
            std::thread::spawn(move || stdin::write_all(rx, pipe, &*reply));
        }
        Ok(child)
    }

    /// Runs to completion; the reply carries the whole output.
    pub fn collect(&self) -> Message {
        let mut child = match self.spawn() {
            Ok(c) => c,
            Err(m) => return m,
        };
        // Both pipes at once (as `wait_with_output` does), so neither can fill up and stall
        // the command; the status then comes from the reaper when there is one.
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (o, e) = (child.child.stdout.take(), child.child.stderr.take());
        let read = std::thread::scope(|s| {
            let out = &mut out;
            let o = o.map(|mut p| s.spawn(move || p.read_to_end(out)));
            let e = e.map_or(Ok(0), |mut p| p.read_to_end(&mut err));
            o.map_or(Ok(0), |h| h.join().unwrap_or(Ok(0))).and(e)
        });
        match read.and_then(|_| child.wait()) {
            Ok(st) => Message::Exited {
                id: self.id,
                status: status_code(st),
                stdout: String::from_utf8_lossy(&out).into_owned(),
                stderr: String::from_utf8_lossy(&err).into_owned(),
            },
            Err(e) => self.error(format!("waiting for {}: {e}", self.argv[0])),
        }
    }

    /// Runs to completion, handing each output chunk to `send` as soon as it is read; returns
    /// the final message (`Exited` with empty output, or `Error`). Every chunk is sent
    /// before the return, so the host sees all output before the status.
    pub fn stream(&self, send: &(dyn Fn(Message) + Sync)) -> Message {
        self.run_streaming(self.spawn(), send)
    }

    /// [`Self::stream`] with the command leading its own process group, whose id goes to
    /// `started` (so the caller can end the command and all it started).
    pub fn stream_in_group(
        &self,
        send: &(dyn Fn(Message) + Sync),
        started: &dyn Fn(u32),
    ) -> Message {
        let child = self.spawn_with(true);
        if let Ok(c) = &child {
            started(c.child.id());
        }
        self.run_streaming(child, send)
    }

    fn run_streaming(
        &self,
        child: Result<Spawned, Message>,
        send: &(dyn Fn(Message) + Sync),
    ) -> Message {
        let mut child = match child {
            Ok(c) => c,
            Err(m) => return m,
        };
        let (out, err) = (child.child.stdout.take(), child.child.stderr.take());
        let id = self.id;
        std::thread::scope(|s| {
            if let Some(p) = out {
                s.spawn(move || pump(p, id, OutStream::Stdout, send));
            }
            if let Some(p) = err {
                s.spawn(move || pump(p, id, OutStream::Stderr, send));
            }
        });
        match child.wait() {
            Ok(st) => Message::Exited {
                id,
                status: status_code(st),
                stdout: String::new(),
                stderr: String::new(),
            },
            Err(e) => self.error(format!("waiting for {}: {e}", self.argv[0])),
        }
    }
}

/// Reads `pipe` until end-of-file, sending what arrives in chunks of at most [`MAX_CHUNK`]
/// bytes that end on character boundaries (an incomplete UTF-8 sequence waits for its rest).
fn pump(mut pipe: impl Read, id: u64, stream: OutStream, send: &(dyn Fn(Message) + Sync)) {
    let mut buf = vec![0u8; MAX_CHUNK];
    let mut have = 0;
    loop {
        let n = match pipe.read(&mut buf[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        have += n;
        let cut = utf8_prefix(&buf[..have]);
        // A buffer full of invalid bytes has no valid prefix: send it lossily anyway.
        let cut = if cut == 0 && have == buf.len() {
            have
        } else {
            cut
        };
        if cut > 0 {
            let data = String::from_utf8_lossy(&buf[..cut]).into_owned();
            send(Message::Output { id, stream, data });
            buf.copy_within(cut..have, 0);
            have -= cut;
        }
    }
    if have > 0 {
        let data = String::from_utf8_lossy(&buf[..have]).into_owned();
        send(Message::Output { id, stream, data });
    }
}

/// Length of the longest prefix of `b` that does not end inside a UTF-8 sequence (invalid
/// bytes count as complete: they become U+FFFD).
fn utf8_prefix(b: &[u8]) -> usize {
    // A sequence is at most 4 bytes: only the last 3 can be an unfinished one.
    for back in 1..=b.len().min(3) {
        let i = b.len() - back;
        let c = b[i];
        if c & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let len = match c {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if back < len { i } else { b.len() };
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_cut_points() {
        assert_eq!(utf8_prefix(b"abc"), 3);
        let e = "é".as_bytes(); // 2 bytes
        assert_eq!(utf8_prefix(&[b'a', e[0]]), 1);
        assert_eq!(utf8_prefix(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(utf8_prefix(&[b'x', euro[0], euro[1]]), 1);
        assert_eq!(utf8_prefix(euro), 3);
        assert_eq!(utf8_prefix(&[0xFF]), 1);
        assert_eq!(utf8_prefix(&[]), 0);
    }

    #[test]
    fn the_image_environment_is_read_as_the_build_writes_it() {
        let text = "# site\nLANG=\"C.UTF-8\"\nQUOTED=\"say \\\"hi\\\" \\\\ end\"\nPLAIN=x=y\n9BAD=1\nno line\n";
        assert_eq!(
            parse_environment(text),
            [
                ("LANG".into(), "C.UTF-8".into()),
                ("QUOTED".into(), "say \"hi\" \\ end".into()),
                ("PLAIN".into(), "x=y".into()),
            ]
        );
    }

    #[test]
    fn big_output_is_chunked_and_complete() {
        let cmd = ExecCmd {
            id: 9,
            argv: vec![
                "sh".into(),
                "-c".into(),
                "i=0; while [ $i -lt 5000 ]; do echo ligne-é-$i; i=$((i+1)); done; echo bad >&2; exit 4"
                    .into(),
            ],
            env: BTreeMap::new(),
            cwd: None,
            stdin: None,
            user: None,
            feed: None,
        };
        let got = std::sync::Mutex::new(Vec::new());
        let end = cmd.stream(&|m| got.lock().unwrap().push(m));
        assert!(
            matches!(
                end,
                Message::Exited {
                    id: 9,
                    status: 4,
                    ..
                }
            ),
            "{end:?}"
        );
        let (mut out, mut err) = (String::new(), String::new());
        for m in got.into_inner().unwrap() {
            let Message::Output {
                id: 9,
                stream,
                data,
            } = m
            else {
                panic!("{m:?}")
            };
            assert!(data.len() <= MAX_CHUNK);
            match stream {
                OutStream::Stdout => out.push_str(&data),
                OutStream::Stderr => err.push_str(&data),
            }
        }
        let want: String = (0..5000).map(|i| format!("ligne-é-{i}\n")).collect();
        assert_eq!(out, want);
        assert_eq!(err, "bad\n");
    }
}
