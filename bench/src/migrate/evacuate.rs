//! Optional: `vse evacuate NODE --wait` on an MPI job of the namespace cluster
//! (`.ci/nscluster-up.sh`: each node its own address, image cache and run directory, so the
//! VM's overlay travels with it). The job is tests/mpi_migrate.rs's: `salloc -N 3 vse launch
//! IMAGE --mpi --spare-nodes 1` running `mpicheck` over the `mpi-lammps.vse.yaml` image with
//! mpicheck added (`--mpi-image`). Measured: the wall time of `vse evacuate` (request to every
//! VM moved) and the move's transfer record from `vse status --json`.

use crate::BenchError;
use serde_json::{Value, json};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `.ci/nscluster-up.sh` leaves the cluster's environment.
const CLUSTER_ENV: &str = "/var/lib/vse-nscluster/slurm.env";
const STEPS: &str = "400";

/// tests/mpi_migrate.rs's policy: migration at a barrier, a rank that never reaches one
/// cancels the move.
const POLICY: &str = "version: 1
name: bench-evacuate
description: Migration at a barrier for vse bench migrate
limits:
  vms_per_core: 2
migration:
  active_memory_threshold: 0.75
  outlier_sigma: 2.0
  persistence: {k: 2, m: 3}
  oversubscription_threshold: 0.99
  cooldown: 5m
  max_concurrent: 1
  barrier:
    deadline: 300s
    action: cancel
";

/// The section's outcome: measured, or why not.
pub enum Evacuation {
    Skipped(String),
    Measured {
        node: String,
        evacuate_ms: u64,
        /// `vse evacuate --json`'s document.
        request: Value,
        /// `migrations[0]` of `vse status --json` after the job ended.
        migration: Value,
        job_exit: Option<i32>,
    },
}

impl Evacuation {
    pub fn json(&self) -> Value {
        match self {
            Evacuation::Skipped(why) => json!({ "skipped": why }),
            Evacuation::Measured {
                node,
                evacuate_ms,
                request,
                migration,
                job_exit,
            } => json!({
                "node": node,
                "evacuate_wall_ms": evacuate_ms,
                "request_state": request.pointer("/request/state"),
                "transfer": migration.pointer("/moves/0/transfer"),
                "phases": phases(request, migration),
                "migration": migration,
                "job_exit_code": job_exit,
            }),
        }
    }
}

/// Where the evacuation's time went, from the request's and the migration's state changes:
/// the request to the plan (the job's controller reads requests as its nodes' samples come
/// in), the plan to the notice posted, the ranks' way to their barrier (`barrier_wait_ms`,
/// reported apart, as it depends on the program), and from the barrier to the moves done
/// (`after_barrier_ms`), next to QEMU's own total time of the transfer. Goal:
/// `after_barrier_vs_qemu` ≤ 1.3.
pub(super) fn phases(request: &Value, migration: &Value) -> Value {
    let at = |state: &str| {
        (migration["events"].as_array().into_iter().flatten())
            .find(|e| e["state"] == state)
            .and_then(|e| e["at_ms"].as_u64())
    };
    let span = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
    let (planned, notice) = (at("planned"), at("notice_posted"));
    let asked = request
        .pointer("/request/created_ms")
        .and_then(Value::as_u64);
    let (ready, done) = (at("ranks_ready"), at("done"));
    let after = span(ready, done);
    let qemu = migration
        .pointer("/moves/0/transfer/total_ms")
        .and_then(Value::as_u64);
    json!({
        "request_to_plan_ms": span(asked, planned),
        "plan_to_notice_ms": span(planned, notice),
        "barrier_wait_ms": span(notice, ready),
        "after_barrier_ms": after,
        "qemu_total_ms": qemu,
        "after_barrier_vs_qemu": after.zip(qemu).map(|(a, q)| a as f64 / q.max(1) as f64),
    })
}

/// `KEY=value` lines of the cluster's env file, or why the section is skipped.
fn cluster_env() -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(CLUSTER_ENV).map_err(|e| {
        format!("the namespace cluster is not up ({CLUSTER_ENV}: {e}); start it with .ci/nscluster-up.sh")
    })?;
    let env: Vec<(String, String)> = (text.lines())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect();
    let conf = env.iter().find(|(k, _)| k == "SLURM_CONF").map(|(_, v)| v);
    let up = conf.is_some_and(|c| {
        Command::new("scontrol")
            .arg("ping")
            .env("SLURM_CONF", c)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !up {
        return Err(format!(
            "the namespace cluster's slurmctld does not answer (SLURM_CONF from {CLUSTER_ENV}); start it with .ci/nscluster-up.sh"
        ));
    }
    Ok(env)
}

/// `--mpi-image` names an image directory (checked before anything is measured).
pub(super) fn check_image(image: &Path) -> Result<(), BenchError> {
    if image.join(vse_image::MANIFEST).is_file() {
        return Ok(());
    }
    Err(BenchError::Invalid(format!(
        "--mpi-image {}: no {} there; hint: a directory `vse build` made (tests/mpi_migrate.rs's image)",
        image.display(),
        vse_image::MANIFEST
    )))
}

/// The section, or the reason it was skipped; a failure once the job started is an error.
pub(super) fn run(
    vse: &Path,
    image: Option<&Path>,
    step: crate::Step,
) -> Result<Evacuation, BenchError> {
    let Some(image) = image else {
        return Ok(Evacuation::Skipped(
            "no --mpi-image DIR (the mpi-lammps.vse.yaml image with mpicheck that tests/mpi_migrate.rs builds, e.g. $VSE_CACHE/vse-test-image-mpicheck)".into(),
        ));
    };
    check_image(image)?;
    let env = match cluster_env() {
        Ok(env) => env,
        Err(why) => return Ok(Evacuation::Skipped(why)),
    };
    let dir = tempfile::Builder::new().prefix("vbe-").tempdir_in("/tmp")?;
    std::fs::write(dir.path().join("bench.policy.yaml"), POLICY)?;
    let name = format!("vbe{}", std::process::id());
    step("vse launch --mpi on the namespace cluster (3 nodes, one spare)");
    let mut job = Job {
        child: Some(start(vse, image, dir.path(), &name, &env)?),
    };
    let db = dir.path().join("state.db");
    let live = job.wait_vms(vse, &db, 2)?;
    let node = live
        .pointer("/vms/1/node")
        .and_then(Value::as_str)
        .ok_or_else(|| BenchError::Failed(format!("no node for rank 1's VM: {live}")))?
        .to_string();
    step(&format!("vse evacuate {node} --wait"));
    let t = Instant::now();
    let o = Command::new(vse)
        .args([
            "evacuate", &node, "--job", &name, "--wait", "--json", "--db",
        ])
        .arg(&db)
        .output()
        .map_err(BenchError::io("running vse evacuate"))?;
    let evacuate_ms = t.elapsed().as_millis() as u64;
    let request: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    if !o.status.success() {
        return Err(BenchError::Failed(format!(
            "vse evacuate {node} exited {}: {}{request}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    step("waiting for the MPI job to end");
    let job_exit = job.finish()?;
    let migration = status(vse, &db)?
        .pointer("/migrations/0")
        .cloned()
        .unwrap_or(Value::Null);
    Ok(Evacuation::Measured {
        node,
        evacuate_ms,
        request,
        migration,
        job_exit,
    })
}

/// tests/mpi_migrate.rs's `Job::start` with 3 nodes: node-local defaults, its own process group.
fn start(
    vse: &Path,
    image: &Path,
    dir: &Path,
    name: &str,
    env: &[(String, String)],
) -> Result<Child, BenchError> {
    let mut cmd = Command::new("salloc");
    cmd.args(["-N", "3", "--time=20", "--quiet"])
        .arg(vse)
        .arg("launch")
        .arg(image)
        .args(["--allocation", "slurm", "--mpi", "--spare-nodes", "1"])
        .args(["--memory", "384", "--vcpus", "1", "--job", name])
        .args(["--node-memory", "1536", "--policy"])
        .arg(dir.join("bench.policy.yaml"))
        .arg("--state-db")
        .arg(dir.join("state.db"))
        .args(["--json", "--", "/usr/local/bin/mpicheck", STEPS, "20000"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("VSE_NODES_SHARE_MACHINE", "1");
    for k in [
        "VSE_IMAGE_CACHE",
        "VSE_RUN_DIR",
        "VSE_LISTEN",
        "VSE_STATE_DB",
    ] {
        cmd.env_remove(k);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(BenchError::io("starting salloc (is Slurm installed?)"))
}

fn status(vse: &Path, db: &Path) -> Result<Value, BenchError> {
    let o = Command::new(vse)
        .args(["status", "--json", "--db"])
        .arg(db)
        .output()
        .map_err(BenchError::io("running vse status"))?;
    Ok(serde_json::from_slice(&o.stdout).unwrap_or(Value::Null))
}

/// The `salloc` process group; stopped (TERM, then KILL) if the bench ends before it does.
struct Job {
    child: Option<Child>,
}

impl Job {
    /// Waits until `n` VMs have samples with the guest's view (their guest agents answer).
    fn wait_vms(&mut self, vse: &Path, db: &Path, n: usize) -> Result<Value, BenchError> {
        let start = Instant::now();
        loop {
            let s = status(vse, db)?;
            let up = (s["samples"].as_array().into_iter().flatten())
                .filter(|x| x["kind"] == "vm" && x["guest"].is_object())
                .count();
            if up == n {
                return Ok(s);
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                let err = self.output().1;
                return Err(BenchError::Failed(format!(
                    "vse launch ended early ({st}): {err}"
                )));
            }
            if start.elapsed() > Duration::from_secs(900) {
                return Err(BenchError::Failed(format!("the job's VMs are not up: {s}")));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn output(&mut self) -> (Option<i32>, String) {
        let Some(c) = self.child.take() else {
            return (None, String::new());
        };
        match c.wait_with_output() {
            Ok(o) => (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Err(e) => (None, e.to_string()),
        }
    }

    /// The job's exit code; a job that did not end well is an error.
    fn finish(&mut self) -> Result<Option<i32>, BenchError> {
        let (code, err) = self.output();
        if code != Some(0) {
            let lines: Vec<&str> = err.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            return Err(BenchError::Failed(format!(
                "the MPI job exited {code:?}: {tail}"
            )));
        }
        Ok(code)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let group = -(c.id() as i32);
        // SAFETY: signals the process group this bench started.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(200));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = c.wait();
    }
}
