//! The PID 1 reaper on the host: this test process makes itself a child subreaper, so orphans
//! of the commands it runs are reparented to it exactly as they are to PID 1 in a VM. One
//! test function only: the reaper owns every child of the process, and nothing else here may
//! start or wait for children.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vse_guest_agent::exec::ExecCmd;
use vse_guest_agent::protocol::Message;
use vse_guest_agent::reaper;

fn cmd(script: &str) -> ExecCmd {
    ExecCmd {
        id: 1,
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::new(),
        cwd: None,
        stdin: None,
        user: None,
        feed: None,
    }
}

/// (pid, state) of every process whose parent is this one.
fn my_children() -> Vec<(u32, char)> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // After the command name: " STATE PPID ...".
        let mut f = stat.rsplit_once(") ").map_or("", |x| x.1).split(' ');
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next() == Some(me.as_str()) {
            out.push((pid, state));
        }
    }
    out
}

/// Waits until this process has no children left, zombies included.
fn until_no_children(what: &str) {
    let t0 = Instant::now();
    loop {
        let left = my_children();
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: children left (pid, state): {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn exited(m: &Message) -> (i32, &str) {
    match m {
        Message::Exited { status, stdout, .. } => (*status, stdout.as_str()),
        other => panic!("expected Exited, got {other:?}"),
    }
}

#[test]
fn orphans_are_reaped_and_commands_keep_their_status() {
    // SAFETY: plain prctl on this process.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(r, 0);
    reaper::install().unwrap();

    // 50 orphans that outlive their command: all of them must have become ours...
    let spawner = "for i in $(seq 50); do (sleep 600 </dev/null >/dev/null 2>&1 &); done; exit 7";
    let end = cmd(spawner).collect();
    assert_eq!(exited(&end).0, 7, "{end:?}");
    let orphans = my_children();
    assert_eq!(orphans.len(), 50, "{orphans:?}");
    assert!(orphans.iter().all(|(_, s)| *s != 'Z'), "{orphans:?}");
    // ...and once they die, none stays a zombie.
    for (pid, _) in &orphans {
        // SAFETY: signals a process this test just counted as its own child.
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
    }
    until_no_children("killed orphans");

    // Orphans that exit on their own while the command is still writing, streamed this time.
    let c = cmd("for i in $(seq 50); do (sleep 0.2 &); echo started $i; done; exit 7");
    let out = std::sync::Mutex::new(String::new());
    let end = c.stream(&|m| {
        if let Message::Output { data, .. } = m {
            out.lock().unwrap().push_str(&data);
        }
    });
    assert_eq!(exited(&end).0, 7, "{end:?}");
    assert_eq!(out.into_inner().unwrap().matches("started").count(), 50);
    until_no_children("orphans that exited");

    // Statuses stay the command's own: exit codes, signals as 128 + n, spawn failures.
    assert_eq!(exited(&cmd("kill -9 $$").collect()).0, 128 + 9);
    assert_eq!(exited(&cmd("kill -TERM $$").stream(&|_| {})).0, 128 + 15);
    let group = cmd("(sleep 0.1 &); exit 3").stream_in_group(&|_| {}, &|_| {});
    assert_eq!(exited(&group).0, 3);
    let mut bad = cmd("");
    bad.argv = vec!["/nonexistent/prog".into()];
    assert!(
        matches!(bad.collect(), Message::Error { message, .. } if message.contains("cannot run"))
    );
    // Many short commands at once, each leaving an orphan: every waiter gets its own status
    // (some exit before their spawn has returned).
    std::thread::scope(|s| {
        for i in 0..16 {
            s.spawn(move || {
                let end = cmd(&format!("(true &); echo {i}; exit {i}")).collect();
                assert_eq!(exited(&end), (i, format!("{i}\n").as_str()), "{end:?}");
            });
        }
    });
    until_no_children("after the concurrent commands");
}
