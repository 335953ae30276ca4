//! An MPI job's VM moves off a node while the job runs, on the Slurm cluster of namespace nodes
//! (`.ci/nscluster-up.sh`: each node its own address, node-local image cache and run directory,
//! so the VM's disk overlay exists only on its node and must travel with it). `vse launch
//! --mpi` runs `mpicheck` (barrier/c/mpicheck.c: ring and all-to-all messages, each
//! sequence-numbered and checksummed, one in flight across every barrier), an unmodified MPI
//! program; the barrier hook comes from the guest agent, preloaded into the ranks. Each node's
//! memory is simulated by a cgroup (`--node-memory`: the namespace nodes share /proc/meminfo).
//! Real binary, real Slurm, real Open MPI, real TCG VMs.
//!
//! Needs root, Slurm, QEMU, the bookworm lists and Open MPI on the host (VSE_MPICHECK:
//! .ci/mpicheck.sh).

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::vm::{built_image_with, vm_slot, vm_tools};
use testkit::hog::Hog;
use testkit::nscluster::NsCluster;

const VSE: &str = env!("CARGO_BIN_EXE_vse");
const NODE_MIB: u64 = 1536;

/// Failure avoidance as in the seed papers (threshold, leave-one-out outlier, persistence);
/// a rank that never reaches a barrier cancels the move.
const POLICY: &str = "version: 1
name: mpi-migrate-test
description: Migration at a barrier for the MPI migration tests
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

fn setup() -> Option<(NsCluster, PathBuf)> {
    testkit::require!(vm_tools() && testkit::tool("salloc"));
    let check = testkit::fixture::env_file("VSE_MPICHECK", "mpicheck.sh")?;
    let cluster = NsCluster::up()?;
    let img = built_image_with("mpi-lammps.vse.yaml", "mpicheck", &[("mpicheck", &check)])?;
    Some((cluster, img))
}

struct Job {
    dir: tempfile::TempDir,
    name: String,
    child: Option<Child>,
}

impl Job {
    /// `salloc -N nodes` running `mpicheck STEPS PAUSE_US` under `vse launch --mpi --json`
    /// with the last node spare.
    fn start(cluster: &NsCluster, img: &Path, nodes: u32, policy: &str, check: [u32; 2]) -> Job {
        Self::start_with(cluster, img, nodes, policy, check, &[], &[])
    }

    /// [`Job::start`] with more `vse launch` options, and more arguments of mpicheck.
    fn start_with(
        cluster: &NsCluster,
        img: &Path,
        nodes: u32,
        policy: &str,
        check: [u32; 2],
        options: &[&str],
        tail: &[&str],
    ) -> Job {
        let mut argv: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        argv.extend([
            "--json".into(),
            "--".into(),
            "/usr/local/bin/mpicheck".into(),
        ]);
        argv.extend(check.map(|n| n.to_string()));
        argv.extend(tail.iter().map(|a| a.to_string()));
        Self::launch(cluster, img, nodes, policy, &argv)
    }

    /// `salloc -N nodes vse launch IMAGE --mpi --spare-nodes 1 … ARGS`.
    fn launch(cluster: &NsCluster, img: &Path, nodes: u32, policy: &str, args: &[String]) -> Job {
        let dir = testkit::short_tempdir("nm");
        std::fs::write(dir.path().join("test.policy.yaml"), policy).unwrap();
        let name = format!("nm{}", std::process::id());
        let child = Command::new("salloc")
            .args(["-N", &nodes.to_string(), "--time=20", "--quiet"])
            .arg(VSE)
            .arg("launch")
            .arg(img)
            .args(["--allocation", "slurm", "--mpi", "--spare-nodes", "1"])
            .args(["--memory", "384", "--vcpus", "1", "--job", &name])
            .args(["--node-memory", &NODE_MIB.to_string()])
            .arg("--policy")
            .arg(dir.path().join("test.policy.yaml"))
            .arg("--state-db")
            .arg(dir.path().join("state.db"))
            .args(args)
            .env("SLURM_CONF", &cluster.conf)
            .env("VSE_NODES_SHARE_MACHINE", "1")
            // Node-local defaults, as on a real cluster: nothing points at a shared directory.
            .env_remove("VSE_IMAGE_CACHE")
            .env_remove("VSE_RUN_DIR")
            .env_remove("VSE_LISTEN")
            .env_remove("VSE_STATE_DB")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: a failed test stops salloc and the launch under it together.
            .process_group(0)
            .spawn()
            .unwrap();
        Job {
            dir,
            name,
            child: Some(child),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("state.db")
    }

    fn status(&self) -> Value {
        let o = Command::new(VSE)
            .args(["status", "--json", "--db"])
            .arg(self.db())
            .output()
            .unwrap();
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }

    /// Waits until `n` VMs have samples with the guest's view (their guest agents answer).
    fn wait_vms(&mut self, n: usize) -> Value {
        let start = Instant::now();
        loop {
            let s = self.status();
            let up = (s["samples"].as_array().into_iter().flatten())
                .filter(|x| x["kind"] == "vm" && x["guest"].is_object())
                .count();
            if up == n {
                return s;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("vse launch ended early with {st}: {:?}", self.finish());
            }
            assert!(
                start.elapsed() < Duration::from_secs(900),
                "VMs not up: {s}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn evacuate(&self, args: &[&str]) -> (Option<i32>, Value, String) {
        let o = Command::new(VSE)
            .arg("evacuate")
            .args(args)
            .args(["--json", "--db"])
            .arg(self.db())
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (
            o.status.code(),
            doc,
            String::from_utf8_lossy(&o.stderr).into(),
        )
    }

    /// The job's exit code and report, printed for the log.
    fn finish(&mut self) -> (Option<i32>, Value, String) {
        let (code, out, err) = self.finish_text();
        (code, serde_json::from_str(&out).unwrap_or(Value::Null), err)
    }

    /// The job's exit code, stdout (what `stream` did not take) and stderr.
    fn finish_text(&mut self) -> (Option<i32>, String, String) {
        let o = self.child.take().unwrap().wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        eprintln!("--- stdout\n{out}--- stderr\n{err}---");
        (o.status.code(), out.into_owned(), err.into_owned())
    }

    /// The job's stdout, line by line as it comes.
    fn stream(&mut self) -> mpsc::Receiver<String> {
        let out = self.child.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        rx
    }
}

impl Drop for Job {
    /// A test that failed mid-job: `vse launch` tears its VMs and agents down on SIGTERM;
    /// SIGKILL only if it does not end in time.
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let group = -(c.id() as i32);
        // SAFETY: signals the process group this test started.
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

/// A directory in the nodes' one "shared file system" (as a site's /home: every namespace
/// node sees the machine's directories but its own /tmp, /var/tmp and /run/vse).
fn shared_results() -> tempfile::TempDir {
    let shared =
        std::env::var_os("VSE_CACHE").map_or_else(|| "/var/cache/vse".into(), PathBuf::from);
    tempfile::Builder::new()
        .prefix("nm-results-")
        .tempdir_in(&shared)
        .unwrap()
}

/// Each of `ranks` ranks wrote its line of every step to its file in `dir`, once, in order.
fn assert_logs(dir: &Path, ranks: u32, steps: u32) {
    for rank in 0..ranks {
        let log = std::fs::read_to_string(dir.join(format!("rank-{rank}.log")))
            .unwrap_or_else(|e| panic!("rank {rank}'s log: {e}"));
        let want: String = (0..steps)
            .map(|s| format!("rank {rank} step {s}\n"))
            .collect();
        assert!(
            log == want,
            "rank {rank}'s log lost, repeated or reordered lines:\n{log}"
        );
    }
}

/// Every message of `ranks` MPI ranks arrived intact, and rank `held`'s VM moved while it
/// waited at a barrier (the hook says so on stderr, which mpirun forwards to rank 0's).
fn assert_mpicheck(report: &Value, ranks: u32, steps: u32, held: u32) {
    let out = report["ranks"][0]["stdout"].as_str().unwrap_or_default();
    let messages = steps * ranks * (ranks + 1);
    let want = format!("MPICHECK ranks={ranks} steps={steps} messages={messages} bad=0");
    assert!(out.contains(&want), "{want} not in {out}");
    let err = report["ranks"][0]["stderr"].as_str().unwrap_or_default();
    let line = format!("vse-barrier: rank {held} held at a barrier while its VM migrated (1)");
    assert!(err.contains(&line), "{line} not in {err}");
}

/// The move was a live migration over node-local disks: the overlay's blocks were copied.
fn assert_moved_with_its_disk(status: &Value, migration: &Value) {
    assert_eq!(migration["state"], "done", "{status}");
    let t = &migration["moves"][0]["transfer"];
    assert_eq!(t["storage"], "block-copy", "{migration}");
    assert!(t["disk_bytes"].as_u64().unwrap_or(0) > 0, "{migration}");
    assert!(t["memory_bytes"].as_u64().unwrap_or(0) > 0, "{migration}");
    eprintln!("migration moved {t}");
}

fn no_vm_or_agent_left(cluster: &NsCluster) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let left = cluster.processes_where(|a| {
            a.first().is_some_and(|p| p.contains("qemu-system"))
                || (a.get(1).is_some_and(|x| x == "agent") && a.iter().any(|x| x == "--parent"))
        });
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < end, "left on the nodes: {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first directory named `name` under `dir` (depth first).
fn find_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name() == name {
            return Some(p);
        }
        if let Some(found) = find_dir(&p, name) {
            return Some(found);
        }
    }
    None
}

fn pool(status: &Value, node: &str) -> String {
    (status["nodes"].as_array().into_iter().flatten())
        .find(|n| n["name"] == node)
        .map_or(String::new(), |n| n["pool"].as_str().unwrap_or("").into())
}

/// Three compute nodes and a spare; a memory hog fills node 2's memory: failure avoidance
/// predicts the failure, rank 1's VM moves to the spare at a barrier with its disk overlay,
/// every message arrives, the node ends defunct.
#[test]
fn mpi_job_migrates_at_barrier_over_node_local_disk_when_a_node_fails() {
    let Some((cluster, img)) = setup() else {
        return;
    };
    let _slot = vm_slot();
    // Three busy emulated VMs and the hog share two cores: a step takes ~150 ms, and the move
    // comes some 70 steps after the hog.
    let steps = 300;
    // Each rank appends to its own file in the nodes' shared directory (as in the
    // evacuation test below) while the daemon moves rank 1's VM.
    let results = shared_results();
    let share = format!("{}:/results", results.path().display());
    let mut job = Job::start_with(
        &cluster,
        &img,
        4,
        POLICY,
        [steps, 20_000],
        &["--no-default-shares", "--share", &share],
        &["/results"],
    );
    let live = job.wait_vms(3);
    let node = live["vms"][1]["node"].as_str().unwrap().to_string();
    // The node agent's cgroup stands for the node: under the namespace node's own, inside
    // the agent's job step (Slurm's cgroups).
    let node_cg = Path::new("/sys/fs/cgroup/memory/vse-nscluster").join(&node);
    let cg = find_dir(&node_cg, &format!("vse-{}-{node}", job.name))
        .unwrap_or_else(|| panic!("no node cgroup of {} under {}", job.name, node_cg.display()));
    assert!(
        cg.strip_prefix(&node_cg)
            .is_ok_and(|rel| rel.starts_with(format!("slurm_{node}"))),
        "{}",
        cg.display()
    );
    // The hog tops the node's Active memory up to 85 %: what the VM already uses counts.
    let used = (live["samples"].as_array().into_iter().flatten())
        .find(|s| s["kind"] == "node" && s["node"] == node.as_str())
        .and_then(|s| s["mem"]["active_kib"].as_u64())
        .expect("a sample of the node")
        / 1024;
    let _hog = Hog::start(&cg, (NODE_MIB * 85 / 100).saturating_sub(used).max(64));
    let (code, report, err) = job.finish();
    assert_eq!(code, Some(0), "{err}");
    assert_mpicheck(&report, 3, steps, 1);
    assert_logs(results.path(), 3, steps);
    let after = job.status();
    let mig = &after["migrations"][0];
    assert_eq!(mig["rule"], "failure-avoidance", "{after}");
    assert_eq!(mig["source"], node.as_str());
    assert_moved_with_its_disk(&after, mig);
    assert_eq!(pool(&after, &node), "defunct");
    let spare = report["nodes"][3].as_str().unwrap();
    assert_eq!(after["vms"][1]["node"], spare, "{after}");
    no_vm_or_agent_left(&cluster);
}

/// Two compute nodes and a spare: bad requests are refused (exit 2) and move nothing; while the
/// spare's disk cannot take the VM's overlay the move is refused (exit 105) and the VM stays;
/// then `vse evacuate` moves rank 1's VM to the spare at a barrier with its disk overlay; a
/// second evacuation finds no spare left (exit 104); every message arrives.
#[test]
fn mpi_job_keeps_every_message_when_evacuate_moves_a_vm_with_its_disk() {
    let Some((cluster, img)) = setup() else {
        return;
    };
    let _slot = vm_slot();
    let steps = 600;
    // Each rank appends a line per step to its own file in the nodes' shared directory,
    // through a descriptor it keeps open while its VM moves.
    let results = shared_results();
    let share = format!("{}:/results", results.path().display());
    // Booted from their kernels: the spare's small disk below must be too small for what the
    // guest wrote to its overlay, and the overlay of a VM restored from a boot template was
    // found to fit in it.
    let mut job = Job::start_with(
        &cluster,
        &img,
        3,
        POLICY,
        [steps, 20_000],
        &["--no-template", "--no-default-shares", "--share", &share],
        &["/results"],
    );
    let live = job.wait_vms(2);
    let node0 = live["vms"][0]["node"].as_str().unwrap().to_string();
    let node1 = live["vms"][1]["node"].as_str().unwrap().to_string();
    let spare = (live["nodes"].as_array().into_iter().flatten())
        .map(|n| n["name"].as_str().unwrap_or_default().to_string())
        .find(|n| *n != node0 && *n != node1)
        .expect("a spare node");
    let (code, _, err) = job.evacuate(&["n9", "--wait"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no running job has a node named n9"), "{err}");
    let (code, _, err) = job.evacuate(&[&node0, "--job", "nosuchjob", "--wait"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = job.evacuate(&[&node0, "--mode", "checkpoint"]);
    assert_eq!(code, Some(2), "{err}");
    {
        // Room for the overlay's header, not for the blocks the guest wrote.
        let _full = cluster.small_disk(&spare, "/tmp", "448k");
        let (code, doc, err) = job.evacuate(&[&node1, "--wait"]);
        assert_eq!(code, Some(105), "{err}\n{doc}");
        assert_eq!(doc["request"]["state"], "failed", "{doc}");
        let s = job.status();
        assert_eq!(s["vms"][1]["node"], node1.as_str(), "{s}");
        assert_eq!(pool(&s, &node1), "allocated", "{s}");
        let note = doc["request"]["note"].as_str().unwrap_or_default();
        assert!(note.contains("copying the disk"), "{doc}");
    }
    let (code, doc, err) = job.evacuate(&[&node1, "--job", &job.name.clone(), "--wait"]);
    assert_eq!(code, Some(0), "{err}\n{doc}");
    assert_eq!(doc["request"]["state"], "done", "{doc}");
    let (code, doc, err) = job.evacuate(&[&node0, "--wait"]);
    assert_eq!(code, Some(104), "{err}\n{doc}");
    assert_eq!(doc["request"]["state"], "no_spare", "{doc}");
    let (code, report, err) = job.finish();
    assert_eq!(code, Some(0), "{err}");
    assert_mpicheck(&report, 2, steps, 1);
    assert_logs(results.path(), 2, steps);
    let after = job.status();
    let mig = (after["migrations"].as_array().into_iter().flatten())
        .find(|m| m["state"] == "done")
        .unwrap_or_else(|| panic!("no migration done: {after}"));
    assert_eq!(mig["rule"], "evacuate", "{after}");
    assert_moved_with_its_disk(&after, mig);
    assert_eq!(pool(&after, &node1), "defunct");
    assert_eq!(pool(&after, &node0), "allocated");
    let spare = report["nodes"][2].as_str().unwrap();
    assert_eq!(after["vms"][1]["node"], spare, "{after}");
    no_vm_or_agent_left(&cluster);
}

/// The policy's barrier deadline passes with `action: cancel` (ranks pause 8 s between
/// barriers, the deadline is 3 s): the move is cancelled (exit 105), the VM stays on its node,
/// the ranks are never held, and the job finishes with every message.
#[test]
fn mpi_job_goes_on_when_its_ranks_miss_the_barrier_deadline() {
    let Some((cluster, img)) = setup() else {
        return;
    };
    let _slot = vm_slot();
    let policy = POLICY.replace("deadline: 300s", "deadline: 3s");
    let steps = 5;
    let mut job = Job::start(&cluster, &img, 3, &policy, [steps, 8_000_000]);
    let live = job.wait_vms(2);
    let node1 = live["vms"][1]["node"].as_str().unwrap().to_string();
    let (code, doc, err) = job.evacuate(&[&node1, "--wait"]);
    assert_eq!(code, Some(105), "{err}\n{doc}");
    assert_eq!(doc["request"]["state"], "failed", "{doc}");
    let note = doc["request"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("did not reach a barrier in time"), "{doc}");
    let (code, report, err) = job.finish();
    assert_eq!(code, Some(0), "{err}");
    let out = report["ranks"][0]["stdout"].as_str().unwrap_or_default();
    let want = format!(
        "MPICHECK ranks=2 steps={steps} messages={} bad=0",
        steps * 6
    );
    assert!(out.contains(&want), "{want} not in {out}");
    let stderr = report["ranks"][0]["stderr"].as_str().unwrap_or_default();
    assert!(!stderr.contains("held at a barrier"), "{stderr}");
    let after = job.status();
    assert_eq!(after["vms"][1]["node"], node1.as_str(), "{after}");
    assert_eq!(after["migrations"][0]["state"], "rolled_back", "{after}");
    assert_eq!(pool(&after, &node1), "allocated", "{after}");
    no_vm_or_agent_left(&cluster);
}

/// LAMMPS steps of each simulation, and the thermo line after which the VM moves.
const MD_STEPS: u32 = 1000;
const MD_MOVE_AT: u32 = 300;

/// `vse launch` arguments running LAMMPS (the image's `lmp`) over every VM: the same
/// Lennard-Jones melt twice in one job (`clear` between them), a thermo line every 100 steps;
/// `timer sync` puts an MPI_Barrier in every step, so a VM can move at one.
fn lammps_args() -> Vec<String> {
    let melt = format!(
        "'units lj' 'atom_style atomic' 'lattice fcc 0.8442' 'region box block 0 8 0 8 0 8' \
         'create_box 1 box' 'create_atoms 1 box' 'mass 1 1.0' \
         'velocity all create 1.44 87287 loop geom' 'pair_style lj/cut 2.5' \
         'pair_coeff 1 1 1.0 1.0 2.5' 'neighbor 0.3 bin' 'fix 1 all nve' 'timer sync' \
         'thermo 100' 'run {MD_STEPS}'"
    );
    let script = format!(
        "echo \"mpi rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE on $(hostname)\" && \
         printf '%s\\n' {melt} 'clear' {melt} > /tmp/in.lj && exec lmp -log none -in /tmp/in.lj"
    );
    ["--", "sh", "-c", &script].map(String::from).to_vec()
}

/// The thermo tables of the LAMMPS runs (through rank 0's mpirun): each from its `Step`
/// header up to `Loop time`, which every run of the same input on as many processes repeats
/// exactly.
fn thermo(out: &str) -> Vec<Vec<String>> {
    let mut tables = Vec::new();
    let mut table: Option<Vec<String>> = None;
    for l in out.lines().filter_map(|l| l.strip_prefix("[rank 0] ")) {
        if l.trim_start().starts_with("Step") {
            table = Some(Vec::new());
        } else if l.starts_with("Loop time") {
            tables.extend(table.take());
            continue;
        }
        if let Some(t) = table.as_mut() {
            t.push(l.to_string());
        }
    }
    tables
}

/// A real application keeps its result: LAMMPS on two VMs runs one simulation twice in a job,
/// and prints the same thermodynamic output, step by step, the second time, when `vse
/// evacuate` moved one of its VMs (over node-local disks, at a barrier) in the middle of it.
/// The job spans both VMs: mpirun in rank 0's VM reaches rank 1's through the guest agents'
/// authenticated rsh service, and each MPI process says where it runs.
#[test]
fn lammps_gives_the_same_result_when_a_vm_is_evacuated_mid_run() {
    let Some((cluster, img)) = setup() else {
        return;
    };
    let _slot = vm_slot();
    let mut job = Job::launch(&cluster, &img, 3, POLICY, &lammps_args());
    let lines = job.stream();
    let mut out = String::new();
    let (at, mut seen) = (MD_MOVE_AT.to_string(), 0);
    for l in lines.iter() {
        out.push_str(&l);
        out.push('\n');
        let row = l.strip_prefix("[rank 0] ").unwrap_or_default();
        if row.split_whitespace().next() == Some(at.as_str()) {
            seen += 1;
            if seen == 2 {
                break;
            }
        }
    }
    let node1 = job.status()["vms"][1]["node"].as_str().unwrap().to_string();
    let (code, doc, err) = job.evacuate(&[&node1, "--wait"]);
    assert_eq!(code, Some(0), "{err}\n{doc}");
    out.extend(lines.try_iter().map(|l| l + "\n"));
    assert_eq!(
        thermo(&out).len(),
        1,
        "the second run ended before the move: {out}"
    );
    let (code, _, err) = job.finish_text();
    out.extend(lines.iter().map(|l| l + "\n"));
    assert_eq!(code, Some(0), "{err}");
    let line = "vse-barrier: rank 1 held at a barrier while its VM migrated (1)";
    assert!(err.contains(line), "{line} not in {err}");
    for r in 0..2 {
        let line = format!("[rank 0] mpi rank {r} of 2 on ");
        let vm = (out.lines().find_map(|l| l.strip_prefix(&line)))
            .unwrap_or_else(|| panic!("MPI rank {r} missing: {out}"));
        assert!(vm.ends_with(&format!("-r{r}")), "rank {r} ran on {vm}");
    }
    let procs = format!("on 2 procs for {MD_STEPS} steps with 2048 atoms");
    assert_eq!(out.matches(&procs).count(), 2, "{out}");
    let runs = thermo(&out);
    assert_eq!(runs.len(), 2, "{out}");
    assert_eq!(runs[0].len() as u32, MD_STEPS / 100 + 2, "{out}");
    assert_eq!(runs[1], runs[0], "{out}");
    let after = job.status();
    assert_moved_with_its_disk(&after, &after["migrations"][0]);
    no_vm_or_agent_left(&cluster);
}
