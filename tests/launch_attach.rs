//! A job outlives its front-end, with the real binary, real agents and real TCG VMs
//! (`local:2`): `vse launch` is SIGKILLed while its ranks count, and `vse attach --job` takes
//! the job over: it prints every number the ranks printed after the kill (the agents held
//! them), takes a checkpoint on request, and exits with the job's status. Without an attach,
//! the node agents stop the VMs and end once the grace period is over: no VM and no agent is
//! left, and a late attach is refused with exit 2.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::vm::{built_image, no_qemu_left, vm_slot, vm_tools};
use support::{counts, follow};

const VSE: &str = env!("CARGO_BIN_EXE_vse");
const LAST: u32 = 80;

/// Each rank counts to LAST, one number every 0.2 s, then exits 7.
fn count_cmd() -> String {
    format!("i=0; while [ $i -lt {LAST} ]; do i=$((i+1)); echo $i; sleep 0.2; done; exit 7")
}

fn launch(img: &Path, tmp: &Path, job: &str, grace: &str) -> Command {
    let mut c = Command::new(VSE);
    c.arg("launch")
        .arg(img)
        .args([
            "--allocation",
            "local:2",
            "--job",
            job,
            "--attach-grace",
            grace,
        ])
        .arg("--checkpoint-dir")
        .arg(tmp.join(format!("ckpt-{job}")))
        .args(["--", "sh", "-c", &count_cmd()])
        .env("VSE_IMAGE_CACHE", tmp.join("cache"))
        .env("VSE_RUN_DIR", tmp.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// Starts `cmd`, waits until both ranks printed `n`, SIGKILLs it; its output so far and the
/// node agents it had started.
fn kill_once_counting(mut cmd: Command, n: u32) -> (String, Vec<i32>) {
    let mut child = cmd.spawn().unwrap();
    // Not joined: the orphaned agents keep the pipe open.
    let (rx, _) = follow(child.stdout.take().unwrap());
    let until = Instant::now() + Duration::from_secs(300);
    let mut out = String::new();
    while let Ok(so_far) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        out = so_far;
        if counts(&out)
            .iter()
            .all(|c| c.last().is_some_and(|l| *l >= n))
        {
            break;
        }
    }
    let agents = children_running(child.id() as i32, "agent");
    assert!(
        counts(&out).iter().all(|c| c.len() >= n as usize) && agents.len() == 2,
        "the job never got to {n} on both ranks (agents {agents:?}):\n{out}"
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    // Everything it printed before it died (the pipe stays open: the orphaned agents
    // inherited it).
    std::thread::sleep(Duration::from_millis(500));
    let out = rx.try_iter().last().unwrap_or(out);
    (out, agents)
}

/// Runs `vse attach --job JOB`; once both ranks printed a few numbers through it, asks the
/// job for a checkpoint (the attached front-end goes on checkpointing). Its exit code, stdout
/// and stderr.
fn attach_and_checkpoint(tmp: &Path, job: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(VSE)
        .args(["attach", "--job", job])
        .env("VSE_RUN_DIR", tmp.join("run"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (rx, reader) = follow(child.stdout.take().unwrap());
    let until = Instant::now() + Duration::from_secs(120);
    while let Ok(so_far) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        if counts(&so_far).iter().all(|c| c.len() >= 3) {
            break;
        }
    }
    let o = Command::new(VSE)
        .args(["checkpoint", "--job", job, "--wait", "--json"])
        .env("VSE_RUN_DIR", tmp.join("run"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(
        v["request"]["state"],
        "done",
        "a checkpoint of the attached job: {v} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), reader.join().unwrap(), err)
}

/// Live children of `parent` with `word` in their command line.
fn children_running(parent: i32, word: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid …: comm may hold spaces, so split after its ')'.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args = String::from_utf8_lossy(&args).replace('\0', " ");
        if fields.get(1) == Some(&parent.to_string().as_str()) && args.split(' ').any(|a| a == word)
        {
            out.push(pid);
        }
    }
    out
}

/// Waits until none of `pids` runs any more.
fn gone(pids: &[i32], within: Duration, when: &str) {
    let until = Instant::now() + within;
    while pids.iter().any(|a| alive(*a)) {
        assert!(
            Instant::now() < until,
            "node agents {pids:?} still run {within:?} {when}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next());
    matches!(state, Some(s) if s != "Z" && s != "X")
}

#[test]
fn a_job_whose_launch_is_killed_is_taken_over_by_attach_or_cleaned_up_after_its_grace() {
    testkit::require!(vm_tools());
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let _slot = vm_slot();

    // 1. Killed while counting; `vse attach` prints the rest and exits with the job's status.
    let (before, agents) = kill_once_counting(launch(&img, tmp.path(), "attachjob", "60"), 10);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        agents.iter().all(|a| alive(*a)),
        "the node agents ended with their front-end"
    );
    let (code, after, err) = attach_and_checkpoint(tmp.path(), "attachjob");
    eprintln!("--- before the kill\n{before}--- attach stdout\n{after}--- attach stderr\n{err}---");
    assert_eq!(code, Some(7), "{err}");
    let (b, a) = (counts(&before), counts(&after));
    for r in 0..2 {
        let last = *b[r].last().unwrap();
        assert_eq!(
            b[r],
            (1..=last).collect::<Vec<_>>(),
            "rank {r} before the kill"
        );
        let first = *a[r].first().expect("output after the attach");
        // Everything the agents held reaches the attach; only a line already on its way
        // into the killed process (sent, not yet printed) may be lost.
        assert!(
            first == last + 1 || first == last + 2,
            "rank {r}: the launch printed up to {last}, the attach starts at {first}"
        );
        assert_eq!(
            a[r],
            (first..=LAST).collect::<Vec<_>>(),
            "rank {r}: every number after the attach, once, in order"
        );
    }
    no_qemu_left(&tmp.path().join("run"));
    gone(
        &agents,
        Duration::from_secs(30),
        "after the attached job ended",
    );
    assert!(
        !tmp.path().join("run/attachjob.state.db.attach").exists(),
        "the finished job left its attach record"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("ckpt-attachjob"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the finished job kept checkpoints: {left:?}"
    );

    // 2. Killed, never attached: the agents stop the VMs and end after the grace period.
    let (_, agents) = kill_once_counting(launch(&img, tmp.path(), "orphanjob", "4"), 3);
    gone(&agents, Duration::from_secs(60), "after their grace of 4 s");
    no_qemu_left(&tmp.path().join("run"));
    let o = Command::new(VSE)
        .args(["attach", "--job", "orphanjob"])
        .env("VSE_RUN_DIR", tmp.path().join("run"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no agent of the job answered"), "{err}");
}
