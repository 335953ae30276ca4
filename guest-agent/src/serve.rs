//! The guest side: answer requests read from the channel until it closes.

use crate::protocol::{Message, PROTOCOL_VERSION, Request};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

fn send(out: &mut dyn Write, m: &Message) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Announces readiness, then serves until EOF. `on_shutdown` powers the machine off.
pub fn serve(
    input: impl Read,
    mut output: impl Write,
    on_shutdown: &dyn Fn(),
) -> std::io::Result<()> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    send(
        &mut output,
        &Message::Ready {
            version: PROTOCOL_VERSION,
            kernel,
        },
    )?;
    for line in BufReader::new(input).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Message::Error {
                id: 0,
                message: format!("bad request: {e}"),
            },
            Ok(Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdin,
            }) => exec(id, &argv, &env, cwd.as_deref(), stdin.as_deref()),
            Ok(Request::Sample { id }) => Message::Sample {
                id,
                meminfo: std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
                stat: std::fs::read_to_string("/proc/stat").unwrap_or_default(),
            },
            Ok(Request::Shutdown { id }) => {
                send(&mut output, &Message::Ok { id })?;
                on_shutdown();
                continue;
            }
        };
        send(&mut output, &reply)?;
    }
    Ok(())
}

fn exec(
    id: u64,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
    cwd: Option<&str>,
    stdin: Option<&str>,
) -> Message {
    let Some((prog, args)) = argv.split_first() else {
        return Message::Error {
            id,
            message: "empty argv".into(),
        };
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(env)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Message::Error {
                id,
                message: format!("cannot run {prog}: {e}"),
            };
        }
    };
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let data = data.to_string();
        std::thread::spawn(move || {
            let _ = pipe.write_all(data.as_bytes());
        });
    }
    match child.wait_with_output() {
        Ok(out) => {
            use std::os::unix::process::ExitStatusExt;
            let status = out
                .status
                .code()
                .or_else(|| out.status.signal().map(|s| 128 + s))
                .unwrap_or(255);
            Message::Exited {
                id,
                status,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        }
        Err(e) => Message::Error {
            id,
            message: format!("waiting for {prog}: {e}"),
        },
    }
}
