//! `vse launch` with live rank output and the job's private VM network, end to end with the
//! real binary, real agents and real TCG VMs (`local:N` allocations on this machine).
//!
//! The image: the minimal spec (busybox), built here once (needs VSE_GUEST_AGENT).

mod support;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};
use support::vm::{accel_note, built_image, no_qemu_left, vm_slot, vm_tools};
use testkit::process::pids_with;

const VSE: &str = env!("CARGO_BIN_EXE_vse");

fn launch(img: &Path, tmp: &Path, extra: &[&str], cmd: &[&str]) -> Child {
    Command::new(VSE)
        .arg("launch")
        .arg(img)
        .args(extra)
        .arg("--")
        .args(cmd)
        .env("VSE_IMAGE_CACHE", tmp.join("cache"))
        .env("VSE_RUN_DIR", tmp.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Lines of the child's stdout as they come, on a channel.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first rank line reaches `vse launch`'s stdout while the rank still runs: the rank
/// prints, then sleeps without end; only killing its VM (after the line was seen) ends the
/// job. A launcher that sent output at the command's end would never print the line.
#[test]
fn rank_output_is_streamed_while_the_rank_runs() {
    if !vm_tools() {
        return;
    }
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let tmp = tempfile::tempdir().unwrap();
    let mut child = launch(
        &img,
        tmp.path(),
        &["--allocation", "local:1"],
        &["sh", "-c", "echo line1 of $VSE_RANK; exec sleep 1000000"],
    );
    let lines = stdout_lines(&mut child);
    let first = lines
        .recv_timeout(Duration::from_secs(600))
        .expect("no output from vse launch");
    assert_eq!(first, "[rank 0] line1 of 0");
    assert!(
        child.try_wait().unwrap().is_none(),
        "vse launch ended before the rank was stopped"
    );
    accel_note(&tmp.path().join("run"));
    // End the job the hard way: the rank's VM dies; the job reports it and cleans up.
    let run = tmp.path().join("run").to_string_lossy().into_owned();
    let qemu = pids_with(&["qemu", &run]);
    assert_eq!(qemu.len(), 1, "{qemu:?}");
    Command::new("kill")
        .args(["-KILL", &qemu[0].to_string()])
        .status()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    assert_eq!(o.status.code(), Some(103), "{err}");
    assert!(err.contains("rank 0"), "{err}");
    no_qemu_left(Path::new(&run));
}

/// Two VMs on the job's private segment, in the site policy's range (10.20.0.0/16) and named
/// by its hostname pattern: rank 1 connects to rank 0 by address (busybox nc) and finds it by
/// name (/etc/hosts); the switch forwarded their frames and heard no stranger.
#[test]
fn ranks_reach_each_other_over_the_job_network() {
    if !vm_tools() {
        return;
    }
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let tmp = tempfile::tempdir().unwrap();
    // Rank 1 retries until rank 0 listens (bounded, so a broken network fails instead of
    // hanging).
    let script = r#"
        r0=${VSE_HOSTS%%,*}
        echo me=$(busybox hostname)
        getent hosts $r0
        if [ "$VSE_RANK" = 0 ]; then
            busybox nc -l -p 7000
        else
            i=0
            until echo hello-from-$VSE_RANK | busybox nc 10.20.0.2 7000; do
                i=$((i+1)); [ $i -gt 600 ] && { echo no route to rank 0 >&2; exit 9; }
                sleep 0.2
            done
        fi
    "#;
    let child = launch(
        &img,
        tmp.path(),
        &[
            "--allocation",
            "local:2",
            "--json",
            "--policy",
            support::specs().join("site.policy.yaml").to_str().unwrap(),
        ],
        &["sh", "-c", script],
    );
    let o = child.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    eprintln!("--- stdout\n{out}--- stderr\n{err}");
    accel_note(&tmp.path().join("run"));
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
    let ranks = v["ranks"].as_array().unwrap();
    let r0 = ranks[0]["stdout"].as_str().unwrap();
    let r1 = ranks[1]["stdout"].as_str().unwrap();
    let (n0, n1) = (
        ranks[0]["vm"].as_str().unwrap(),
        ranks[1]["vm"].as_str().unwrap(),
    );
    // Rank 0 received rank 1's line over the network.
    assert!(r0.contains("hello-from-1\n"), "{r0}");
    // Each guest is named by the policy's `network.hostname` (`vm-{job}-{rank}`; outside a
    // batch job, {job} is the launch's own job name, the prefix of the VM names), and
    // resolves rank 0's name to its job address.
    let job = n0.strip_suffix("-r0").expect("VM names end in -r<rank>");
    assert_eq!(n1, format!("{job}-r1"));
    let (h0, h1) = (format!("vm-{job}-0"), format!("vm-{job}-1"));
    assert!(r0.contains(&format!("me={h0}\n")), "{r0}");
    assert!(r1.contains(&format!("me={h1}\n")), "{r1}");
    assert!(
        r1.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"10.20.0.2") && f.contains(&h0.as_str())
        }),
        "{r1}"
    );
    let net = &v["network"];
    assert!(net["forwarded"].as_u64().unwrap() > 0, "{net}");
    assert_eq!(net["dropped_unknown_source"], 0, "{net}");
    no_qemu_left(&tmp.path().join("run"));
}
