//! vse-guest-agent: the agent baked into every VSE image (binary) and the host↔guest
//! protocol with its host-side client, [`GuestLink`] (library). The channel is a virtio-serial
//! port named [`protocol::PORT_NAME`]; no network or ssh is needed to control a VM.

pub mod account;
pub mod exec;
pub mod host;
pub mod hub;
pub mod identity;
pub mod net;
pub mod preload;
pub mod protocol;
pub mod reaper;
pub mod rsh;
pub mod serve;
pub mod share;
pub mod stdin;
mod sync;

pub use host::{
    BarrierRelay, Barriers, ExecOutput, GuestIdentity, GuestLink, GuestNet, LinkError, LinkOptions,
    PendingExec,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    pub(crate) const T: Duration = Duration::from_secs(30);

    #[test]
    fn runs_commands_and_reports_status_and_output() {
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let hub = hub::Hub::new();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &hub));
        let c = GuestLink::over(host, &LinkOptions::new(T)).unwrap();
        assert!(!c.kernel().is_empty());
        let out = c
            .exec(&["sh", "-c", "echo out; echo err >&2; exit 3"], T)
            .unwrap();
        assert_eq!(out.status, 3);
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        let e = c.exec(&["/nonexistent/prog"], T).unwrap_err();
        assert!(
            e.to_string().contains("cannot run /nonexistent/prog"),
            "{e}"
        );
        // Checked before anything changes (a valid request would rename this host).
        let bad = GuestIdentity {
            hostname: "vm-1",
            machine_id: "not-hex",
            entropy: &[1; 32],
            mac: None,
        };
        let e = c.reidentify(bad, T).unwrap_err();
        assert!(e.to_string().contains("invalid machine id"), "{e}");
        let (mem, stat) = c.sample(T).unwrap();
        assert!(mem.contains("MemTotal:") && stat.starts_with("cpu "));
        c.shutdown(T).unwrap();
        drop(c);
        t.join().unwrap().unwrap();
    }

    /// Standard input streamed to a command: every byte arrives once and in order, across
    /// many chunks, and its end is the command's end of input; a command that stops reading
    /// early ends the stream without hanging anyone.
    #[test]
    fn streamed_stdin_arrives_whole_and_its_end_is_delivered() {
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let hub = hub::Hub::new();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &hub));
        let c = std::sync::Arc::new(GuestLink::over(host, &LinkOptions::new(T)).unwrap());
        let input: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let me = protocol::GuestUser::current();
        let mut out = String::new();
        let status = c
            .run_with_input(
                &["sh", "-c", "wc -c; echo done"],
                Default::default(),
                me.clone(),
                None,
                std::io::Cursor::new(input.clone()),
                &mut |_, d| out.push_str(d),
            )
            .unwrap();
        assert_eq!(status, 0);
        assert_eq!(out, format!("{}\ndone\n", input.len()));
        let mut out = String::new();
        let status = c
            .run_with_input(
                &["head", "-c", "5"],
                Default::default(),
                me,
                None,
                std::io::Cursor::new(input),
                &mut |_, d| out.push_str(d),
            )
            .unwrap();
        assert_eq!((status, out.as_str()), (0, "0\n1\n2"));
        c.shutdown(T).unwrap();
        drop(c);
        t.join().unwrap().unwrap();
    }

    /// The guest side goes away in the middle of a command: the host hears so instead of
    /// waiting for an exit that never comes.
    #[test]
    fn a_closed_channel_ends_the_wait_for_a_command() {
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let hub = hub::Hub::new();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &hub));
        let c = GuestLink::over(host.try_clone().unwrap(), &LinkOptions::new(T)).unwrap();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            host.shutdown(std::net::Shutdown::Both).unwrap();
        });
        let e = c
            .run(&["sleep", "5"], Default::default(), &mut |_, _| {})
            .unwrap_err();
        assert!(matches!(e, LinkError::Closed), "{e}");
        killer.join().unwrap();
        t.join().unwrap().unwrap();
    }
}

#[cfg(test)]
mod stream_tests {
    use super::protocol::OutStream;
    use super::*;
    use std::os::unix::net::UnixStream;

    /// The first line reaches the host while the command still runs: the command waits for a
    /// marker the host creates only once it has seen that line (no timing involved).
    #[test]
    fn output_arrives_while_the_command_runs() {
        let tmp = std::env::temp_dir().join(format!("vse-ga-stream-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let hub = hub::Hub::new();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &hub));
        let c = GuestLink::over(host, &LinkOptions::new(tests::T)).unwrap();
        let script = format!(
            "echo line1; while [ ! -e {m} ]; do sleep 0.05; done; echo line2; echo e >&2; exit 5",
            m = tmp.display()
        );
        let mut env = std::collections::BTreeMap::new();
        env.insert("X".to_string(), "y".to_string());
        let (mut out, mut err) = (String::new(), String::new());
        let status = c
            .run(&["sh", "-c", &script], env.clone(), &mut |s, d| match s {
                OutStream::Stdout => {
                    out.push_str(d);
                    if out == "line1\n" {
                        std::fs::write(&tmp, b"go").unwrap();
                    }
                }
                OutStream::Stderr => err.push_str(d),
            })
            .unwrap();
        assert_eq!(status, 5);
        assert_eq!(out, "line1\nline2\n");
        assert_eq!(err, "e\n");
        let e = c.run(&["/nonexistent/x"], env, &mut |_, _| {});
        assert!(e.unwrap_err().to_string().contains("cannot run"));
        let _ = std::fs::remove_file(&tmp);
        c.shutdown(tests::T).unwrap();
        drop(c);
        t.join().unwrap().unwrap();
    }
}

#[cfg(test)]
mod old_agent_tests {
    use super::protocol::{Message, OutStream, Request};
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    /// An agent from before `exec-stream` (it answers unknown requests with an id-0 error):
    /// the link falls back to `exec` and still hands over the whole output.
    #[test]
    fn streaming_falls_back_to_exec_on_old_agents() {
        let (host, guest) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut w = guest.try_clone().unwrap();
            let send = |w: &mut UnixStream, m: &Message| {
                let mut l = serde_json::to_vec(m).unwrap();
                l.push(b'\n');
                w.write_all(&l).unwrap();
            };
            send(
                &mut w,
                &Message::Ready {
                    version: protocol::PROTOCOL_VERSION,
                    kernel: "old".into(),
                },
            );
            for line in BufReader::new(guest).lines() {
                let line = line.unwrap();
                match serde_json::from_str::<Request>(&line).unwrap() {
                    // The link's readiness ping.
                    Request::Sample { id } => send(&mut w, &Message::Sample {
                        id,
                        meminfo: String::new(),
                        stat: String::new(),
                    }),
                    Request::ExecStream { .. } => send(&mut w, &Message::Error {
                        id: 0,
                        message: "bad request: unknown variant `exec-stream`, expected one of `exec`, `sample`".into(),
                    }),
                    Request::Exec { id, argv, .. } => {
                        assert_eq!(argv, ["echo", "x"]);
                        send(&mut w, &Message::Exited { id, status: 2, stdout: "x\n".into(), stderr: "e\n".into() });
                        return;
                    }
                    other => panic!("{other:?}"),
                }
            }
        });
        let c = GuestLink::over(host, &LinkOptions::new(tests::T)).unwrap();
        assert_eq!(c.kernel(), "old");
        let mut got = Vec::new();
        let status = c
            .run(&["echo", "x"], Default::default(), &mut |s, d| {
                got.push((s, d.to_string()))
            })
            .unwrap();
        assert_eq!(status, 2);
        assert_eq!(
            got,
            [
                (OutStream::Stdout, "x\n".to_string()),
                (OutStream::Stderr, "e\n".to_string())
            ]
        );
        t.join().unwrap();
    }
}

#[cfg(test)]
mod relay_tests {
    use super::protocol::{Message, Request};
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    fn next_message(r: &mut impl BufRead) -> Message {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str(line.trim()).unwrap()
    }

    #[test]
    fn barrier_lines_are_relayed_both_ways_and_queued_across_host_ends() {
        let hub = hub::Hub::new();
        let (rank_app, rank_agent) = UnixStream::pair().unwrap();
        hub.clone().add_rank(rank_agent);
        // No host end yet: the rank's line waits in the hub.
        (&rank_app).write_all(b"HELLO job vm 0\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let h2 = hub.clone();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &h2));
        let mut from_guest = BufReader::new(host.try_clone().unwrap());
        assert!(matches!(
            next_message(&mut from_guest),
            Message::Ready { .. }
        ));
        let conn = match next_message(&mut from_guest) {
            Message::Barrier { conn, line } => {
                assert_eq!(line, "HELLO job vm 0");
                conn
            }
            other => panic!("expected the queued barrier line, got {other:?}"),
        };
        let mut req = serde_json::to_vec(&Request::Barrier {
            conn,
            line: "NOTICE 7".into(),
        })
        .unwrap();
        req.push(b'\n');
        (&host).write_all(&req).unwrap();
        let mut rank_in = BufReader::new(rank_app.try_clone().unwrap());
        let mut got = String::new();
        rank_in.read_line(&mut got).unwrap();
        assert_eq!(got, "NOTICE 7\n");
        // The controller side closes: the rank reads end-of-file.
        let mut close = serde_json::to_vec(&Request::BarrierClose { conn }).unwrap();
        close.push(b'\n');
        (&host).write_all(&close).unwrap();
        got.clear();
        assert_eq!(rank_in.read_line(&mut got).unwrap(), 0);
        drop(rank_app);
        assert!(matches!(
            next_message(&mut from_guest),
            Message::BarrierClosed { conn: c } if c == conn
        ));
        host.shutdown(std::net::Shutdown::Both).unwrap();
        t.join().unwrap().unwrap();
    }
}
