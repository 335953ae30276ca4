//! The guest side: answer requests read from the channel until it closes.

use crate::hub::Hub;
use crate::protocol::{Message, PROTOCOL_VERSION, Request};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// Announces readiness, then serves until EOF. `on_shutdown` powers the machine off.
/// Commands run on their own threads, so a long job never delays barrier traffic or samples;
/// every reply goes through `hub`, which outlives this host connection.
pub fn serve(
    input: impl Read,
    output: impl Write + Send + 'static,
    on_shutdown: &dyn Fn(),
    hub: &Arc<Hub>,
) -> std::io::Result<()> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    hub.attach(
        Box::new(output),
        &Message::Ready {
            version: PROTOCOL_VERSION,
            kernel,
        },
    )?;
    let result = requests(input, on_shutdown, hub);
    hub.detach();
    result
}

fn requests(input: impl Read, on_shutdown: &dyn Fn(), hub: &Arc<Hub>) -> std::io::Result<()> {
    for line in BufReader::new(input).lines() {
        let line = line?;
        let line = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str::<Request>(line) {
            Err(e) => hub.send(&Message::Error {
                id: 0,
                message: format!("bad request: {e}"),
            }),
            Ok(Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdin,
            }) => {
                let hub = hub.clone();
                std::thread::spawn(move || {
                    hub.send(&exec(id, &argv, &env, cwd.as_deref(), stdin.as_deref()))
                });
            }
            Ok(Request::Sample { id }) => hub.send(&Message::Sample {
                id,
                meminfo: std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
                stat: std::fs::read_to_string("/proc/stat").unwrap_or_default(),
            }),
            Ok(Request::Barrier { conn, line }) => hub.to_rank(conn, &line),
            Ok(Request::BarrierClose { conn }) => hub.close_rank(conn),
            Ok(Request::Shutdown { id }) => {
                hub.send(&Message::Ok { id });
                on_shutdown();
            }
        }
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
