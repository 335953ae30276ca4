//! The guest side: answer requests read from the channel until it closes.

use crate::exec::{ExecCmd, Feed};
use crate::hub::Hub;
use crate::protocol::{Message, PROTOCOL_VERSION, Request};
use crate::share::proto::{MAX_PAYLOAD, checksum};
use crate::stdin::Chunk;
use std::io::{BufRead, BufReader, Read, Write};
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
    let mut reader = BufReader::new(input);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if reader.read_until(b'\n', &mut raw)? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&raw);
        let line = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        if line.is_empty() {
            continue;
        }
        let req = serde_json::from_str::<Request>(line);
        let streamed = matches!(req, Ok(Request::ExecStream { .. }));
        match req {
            // Not JSON at all: the start of a line a switchover cut (the old host end's),
            // run into the new end's first. Nothing to answer; the new end asks again.
            Err(_) if serde_json::from_str::<serde_json::Value>(line).is_err() => {
                eprintln!(
                    "vse-agent: dropped a line that is not JSON ({} bytes)",
                    line.len()
                );
            }
            // A request this agent does not know (a newer host): every waiter hears why.
            Err(e) => hub.send(&Message::Error {
                id: 0,
                message: format!("bad request: {e}"),
            }),
            Ok(
                Request::Exec {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                    user,
                    stdin_stream,
                }
                | Request::ExecStream {
                    id,
                    argv,
                    env,
                    cwd,
                    stdin,
                    user,
                    stdin_stream,
                },
            ) => {
                let hub = hub.clone();
                // Opened here, on the request loop: its first chunk may come next.
                let feed = stdin_stream.then(|| hub.feeds.open(id));
                std::thread::spawn(move || {
                    let h = hub.clone();
                    let cmd = ExecCmd {
                        id,
                        argv,
                        env,
                        cwd,
                        stdin,
                        user,
                        feed: feed.map(|rx| Feed::new(rx, move |m| h.send(&m))),
                    };
                    let done = if streamed {
                        cmd.stream(&|m| hub.send(&m))
                    } else {
                        cmd.collect()
                    };
                    hub.feeds.close(id);
                    hub.send(&done)
                });
            }
            Ok(Request::FsReply {
                req,
                result,
                bytes,
                sum,
            }) => {
                // The data follows the line. An answer whose data does not add up (the end
                // of an old host end's, run into a new end's bytes) is dropped: the
                // operation is still waiting, and is sent again.
                let mut data = Vec::new();
                if bytes <= MAX_PAYLOAD {
                    (&mut reader)
                        .take(u64::from(bytes))
                        .read_to_end(&mut data)?;
                }
                if data.len() == bytes as usize && checksum(&data) == sum {
                    hub.fs_answer(req, (result, data));
                } else {
                    eprintln!(
                        "vse-agent: dropped the answer to share operation {req}: its data is damaged"
                    );
                }
            }
            Ok(Request::FsResend) => hub.fs_resend(),
            Ok(Request::Mount { id, shares }) => {
                let hub = hub.clone();
                // Mounting waits for the kernel's FUSE handshake: off the request loop, which
                // carries the answers to the mount's first operations.
                std::thread::spawn(move || {
                    let remote: Arc<dyn crate::share::fs::Remote> = hub.clone();
                    hub.send(&match hub.mounts.mount(remote, &shares) {
                        Ok(()) => Message::Ok { id },
                        Err(message) => Message::Error { id, message },
                    });
                });
            }
            Ok(Request::NetConfig {
                id,
                mac,
                ip,
                prefix,
                hostname,
                hosts,
                rsh_key,
                rsh_env,
                rsh_user,
            }) => {
                let hub = hub.clone();
                // The NIC may still be probing: wait off the request loop.
                std::thread::spawn(move || {
                    let c = crate::net::NetConfig {
                        mac: &mac,
                        ip,
                        prefix,
                        hostname: &hostname,
                        hosts: &hosts,
                    };
                    let done = crate::net::configure(&c).and_then(|_| {
                        rsh_key.map_or(Ok(()), |k| crate::net::start_rsh(ip, &k, rsh_env, rsh_user))
                    });
                    hub.send(&match done {
                        Ok(()) => Message::Ok { id },
                        Err(e) => Message::Error {
                            id,
                            message: format!("network set-up: {e}"),
                        },
                    })
                });
            }
            Ok(Request::Reidentify {
                id,
                hostname,
                machine_id,
                entropy,
                time_unix_ns,
                mac,
            }) => hub.send(&reidentify(
                id,
                &crate::identity::Identity {
                    hostname: &hostname,
                    machine_id: &machine_id,
                    entropy: &crate::rsh::unhex(&entropy).unwrap_or_default(),
                    time_unix_ns,
                    mac: mac.as_deref(),
                },
            )),
            Ok(Request::Stdin {
                id,
                exec,
                offset,
                data,
                eof,
            }) => {
                let Some(data) = crate::rsh::unhex(&data) else {
                    hub.send(&Message::Error {
                        id,
                        message: "stdin: data is not hex".into(),
                    });
                    continue;
                };
                let chunk = Chunk {
                    req: id,
                    offset,
                    data,
                    eof,
                };
                if hub.feeds.push(exec, chunk).is_err() {
                    hub.send(&Message::Error {
                        id,
                        message: format!("stdin: command {exec} reads no more input"),
                    });
                }
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
}

/// Applied on the request loop: nothing else may run with the template's identity meanwhile.
fn reidentify(id: u64, identity: &crate::identity::Identity) -> Message {
    match crate::identity::apply(identity) {
        Ok(()) => Message::Ok { id },
        Err(e) => Message::Error {
            id,
            message: format!("new identity: {e}"),
        },
    }
}
