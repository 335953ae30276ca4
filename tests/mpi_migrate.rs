//! A running MPI job's VM moves while the job's ranks wait at `MPI_Barrier`, end to end with
//! the real binary, real agents, real TCG VMs and real Open MPI: `vse launch --mpi` over three
//! nodes (two with a VM each, one spare) runs `mpicheck` (barrier/c/mpicheck.c: ring and
//! all-to-all messages, each sequence-numbered and checksummed, one in flight across every
//! barrier), an unmodified MPI program; the barrier hook comes from the guest agent, preloaded
//! into the ranks. The job must end with every message intact and the rank held at a barrier.
//!
//! Needs QEMU, the bookworm lists, Open MPI on the host (VSE_MPICHECK: .ci/mpicheck.sh).

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::vm::{built_image_with, vm_slot, vm_tools};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// Live migration at a barrier, no rule that fires by itself: evacuations decide.
const POLICY: &str = "version: 1
name: mpi-migrate-test
description: Migration at a barrier for the MPI migration test
limits:
  vms_per_core: 2
migration:
  active_memory_threshold: 0.99
  oversubscription_threshold: 0.99
  persistence: {k: 3, m: 3}
  cooldown: 5m
  max_concurrent: 1
  barrier:
    deadline: 300s
    action: cancel
";

fn image() -> Option<PathBuf> {
    if !vm_tools() {
        return None;
    }
    let check = testkit::fixture::env_file("VSE_MPICHECK", "mpicheck.sh")?;
    built_image_with("mpi-lammps.vse.yaml", "mpicheck", &[("mpicheck", &check)])
}

fn status(db: &Path) -> Value {
    let o = Command::new(VSE)
        .args(["status", "--json", "--db"])
        .arg(db)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// Waits until `n` VMs have samples with the guest's view (their guest agents answer).
fn wait_vms(db: &Path, child: &mut std::process::Child, n: usize) -> Value {
    let start = Instant::now();
    loop {
        let s = status(db);
        let up = (s["samples"].as_array().into_iter().flatten())
            .filter(|x| x["kind"] == "vm" && x["guest"].is_object())
            .count();
        if up == n {
            return s;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("vse launch ended early with {st}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "VMs not up: {s}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn mpi_job_keeps_every_message_when_evacuate_moves_a_vm_at_its_barrier() {
    let Some(img) = image() else {
        return;
    };
    let _slot = vm_slot();
    let dir = testkit::short_tempdir("mm");
    let p = dir.path();
    std::fs::write(p.join("test.policy.yaml"), POLICY).unwrap();
    let db = p.join("state.db");
    let job = format!("mpi{}", std::process::id());
    let steps = 3000;
    let mut child = Command::new(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "local:3", "--spare-nodes", "1", "--mpi"])
        .args(["--memory", "384", "--vcpus", "1", "--job", &job])
        .arg("--policy")
        .arg(p.join("test.policy.yaml"))
        .arg("--state-db")
        .arg(&db)
        .args([
            "--json",
            "--",
            "/usr/local/bin/mpicheck",
            &steps.to_string(),
            "20000",
        ])
        .env("VSE_IMAGE_CACHE", p.join("cache"))
        .env("VSE_RUN_DIR", p.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let live = wait_vms(&db, &mut child, 2);
    // Rank 1's VM only hosts MPI processes started by rank 0's mpirun over rsh.
    let node = live["vms"][1]["node"].as_str().unwrap().to_string();
    let o = Command::new(VSE)
        .args(["evacuate", &node, "--wait", "--json", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("--- stdout\n{stdout}--- stderr\n{stderr}---");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{doc} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(doc["request"]["state"], "done", "{doc}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let rank0 = report["ranks"][0]["stdout"].as_str().unwrap_or_default();
    let messages = steps * (2 * 2 + 2);
    assert!(
        rank0.contains(&format!(
            "MPICHECK ranks=2 steps={steps} messages={messages} bad=0"
        )),
        "{rank0}"
    );
    let err0 = report["ranks"][0]["stderr"].as_str().unwrap_or_default();
    assert!(
        err0.contains("vse-barrier: rank 1 held at a barrier while its VM migrated (1)"),
        "the moved VM's rank was not held at a barrier: {err0}"
    );
    let after = status(&db);
    let mig = &after["migrations"][0];
    assert_eq!(mig["state"], "done", "{after}");
    assert_eq!(mig["rule"], "evacuate");
    let spare = report["nodes"][2].as_str().unwrap();
    assert_eq!(after["vms"][1]["node"], spare, "{after}");
    testkit::process::assert_no_qemu_left(p, Duration::from_secs(60));
}
