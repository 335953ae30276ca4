//! Seed 002 §3 end to end with real MPI: a 4-rank Open MPI job, each rank on its own "VM",
//! linked with the MPI_Barrier PMPI wrapper. The controller posts a notice for one VM; that
//! rank blocks at its next barrier, the controller migrates it, acknowledges, the node goes
//! to the defunct pool, and the program verifies that no message was lost or duplicated.

use control::migrate::*;
use control::model::*;
use control::state::{MigrationState, StateDb};
use monitor::{JobId, NodeName, VmId};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::process::KillOnDrop;

fn lib_dir() -> PathBuf {
    // tests run from <target>/<profile>/deps; the cdylib sits in <target>/<profile>.
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Compiles tests/c/ring.c against the wrapper and the hook library.
fn build_ring(dir: &Path) -> Option<PathBuf> {
    let wrapper = env!("VSE_BARRIER_MPI_LIB");
    testkit::require!(
        !wrapper.is_empty(),
        "the MPI_Barrier wrapper (mpicc was not found when vse-barrier was built)",
        "apt-get install libopenmpi-dev openmpi-bin, then rebuild"
    );
    testkit::require!(testkit::tool("mpirun"));
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join("ring");
    let lib = lib_dir();
    assert!(
        lib.join("libvse_barrier.so").exists(),
        "no cdylib in {}",
        lib.display()
    );
    let st = Command::new(env!("VSE_BARRIER_MPICC"))
        .arg(crate_dir.join("tests/c/ring.c"))
        .arg(format!("-I{}", crate_dir.join("include").display()))
        .arg(wrapper)
        .arg(format!("-L{}", lib.display()))
        .arg("-lvse_barrier")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "mpicc failed");
    Some(out)
}

/// Compiles c/mpicheck.c: plain MPI, no vse header, no link to the hook.
fn build_mpicheck(dir: &Path) -> Option<PathBuf> {
    testkit::require!(testkit::tool("mpicc"));
    testkit::require!(testkit::tool("mpirun"));
    let out = dir.join("mpicheck");
    let st = Command::new("mpicc")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("c/mpicheck.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "mpicc failed");
    Some(out)
}

fn mpirun(ring: &Path, socket: &Path, iters: u32, pause_us: u32) -> KillOnDrop {
    mpirun_with(ring, socket, iters, pause_us, &[])
}

fn mpirun_with(
    ring: &Path,
    socket: &Path,
    iters: u32,
    pause_us: u32,
    extra: &[&str],
) -> KillOnDrop {
    // One "VM" per rank: the guest agent would export VSE_VM_ID inside each VM.
    let script = r#"VSE_VM_ID=vm$OMPI_COMM_WORLD_RANK exec "$0" "$@""#;
    let child = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "4",
            "--mca",
            "btl",
            "self,tcp",
        ])
        .args(extra)
        .args(["sh", "-c", script])
        .arg(ring)
        .arg(iters.to_string())
        .arg(pause_us.to_string())
        .env("VSE_BARRIER_SOCKET", socket)
        .env("VSE_JOB_ID", "job1")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun");
    KillOnDrop(child)
}

/// "Migration" that is real work for the test: it holds the VM for a while and records it.
struct Recorder {
    moved: Vec<(VmId, NodeName, NodeName)>,
}
impl LiveMigrator for Recorder {
    fn live_migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), MigrateError> {
        std::thread::sleep(Duration::from_millis(300));
        self.moved.push((vm.clone(), from.clone(), to.clone()));
        Ok(())
    }
}

fn nm(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}

/// Job `job1` with VMs vm0..vm3 on nodes n0..n3 and a free node f0.
fn four_vm_job(dir: &Path, mem_kib: u64) -> (JobId, StateDb) {
    let job = JobId::new("job1").unwrap();
    let mut db = StateDb::open(&dir.join("state.db")).unwrap();
    for i in 0..4 {
        db.upsert_node(&nm(&format!("n{i}")), Pool::Free).unwrap();
        let vm = VmId::new(format!("vm{i}")).unwrap();
        db.add_vm(&job, &vm, &nm(&format!("n{i}")), mem_kib)
            .unwrap();
    }
    db.upsert_node(&nm("f0"), Pool::Free).unwrap();
    (job, db)
}

/// Until all four ranks have connected to the barrier server.
fn wait_for_ranks(server: &BarrierServer, job: &JobId, run: &mut KillOnDrop) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.ranks(job).len() < 4 {
        assert!(Instant::now() < deadline, "ranks never connected");
        if let Some(st) = run.0.try_wait().unwrap() {
            panic!("mpirun exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// vm2 from n2 to the free node, n2 defunct afterwards.
fn move_vm2(job: &JobId, rule: &str) -> Plan {
    Plan {
        rule: rule.into(),
        job: job.clone(),
        source: nm("n2"),
        moves: vec![Move {
            vm: VmId::new("vm2").unwrap(),
            dest: nm("f0"),
            mem_max_kib: 1 << 20,
        }],
        source_fate: SourceFate::Defunct,
        reason: "test".into(),
    }
}

const CANCEL_AFTER_60S: BarrierConfig = BarrierConfig {
    deadline_s: 60,
    on_deadline: DeadlineAction::Cancel,
};

#[test]
fn mpi_rank_blocks_at_barrier_while_its_vm_migrates() {
    let dir = tempfile::tempdir().unwrap();
    let Some(ring) = build_ring(dir.path()) else {
        return;
    };
    let socket = dir.path().join("barrier.sock");
    let server = BarrierServer::bind(&socket).unwrap();
    let (job, mut db) = four_vm_job(dir.path(), 1 << 20);
    let mut run = mpirun(&ring, &socket, 300, 20_000);
    wait_for_ranks(&server, &job, &mut run);
    let plan = move_vm2(&job, "failure-avoidance");
    let mut mig = Recorder { moved: Vec::new() };
    let outcome = run_plan(&mut db, &server, &mut mig, &plan, &CANCEL_AFTER_60S).unwrap();
    let Outcome::Completed { id } = outcome else {
        panic!("{outcome:?}")
    };

    let out = std::mem::replace(&mut run.0, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "MPI job failed");
    for r in 0..4 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {r} ")))
            .expect("rank line");
        let expected_migrations = if r == 2 { 1 } else { 0 };
        assert!(line.contains("received 300 errors 0"), "{line}");
        assert!(
            line.contains("checks 301"),
            "every MPI_Barrier went through the hook: {line}"
        );
        assert!(
            line.ends_with(&format!("migrations {expected_migrations}")),
            "{line}"
        );
    }
    assert_eq!(mig.moved.len(), 1);
    let m = db.migration(id).unwrap();
    assert_eq!(m.state, MigrationState::Done);
    assert!(m.moves.iter().all(|mv| mv.ready && mv.moved));
    let nodes = db.nodes().unwrap();
    assert_eq!(
        nodes.iter().find(|n| n.name.as_str() == "n2").unwrap().pool,
        Pool::Defunct
    );
    let vms = db.vms(Some(&job)).unwrap();
    assert_eq!(
        vms.iter()
            .find(|v| v.vm.as_str() == "vm2")
            .unwrap()
            .node
            .as_str(),
        "f0"
    );
}

/// What `vse launch --mpi` does in the guests: an unmodified MPI program, the hook preloaded
/// into its ranks only (the library the guest agent installs), one rank's "VM" migrated while
/// that rank is held at MPI_Barrier; every ring and all-to-all message arrives intact.
#[test]
fn preloaded_hook_holds_an_unmodified_mpi_program_at_its_barrier() {
    let dir = tempfile::tempdir().unwrap();
    let Some(check) = build_mpicheck(dir.path()) else {
        return;
    };
    let lib = dir.path().join("libvse-barrier-mpi.so");
    vse_guest_agent::preload::install(&lib).unwrap();
    let socket = dir.path().join("barrier.sock");
    let server = BarrierServer::bind(&socket).unwrap();
    let (job, mut db) = four_vm_job(dir.path(), 1 << 20);
    let preload = format!("LD_PRELOAD={}", lib.display());
    let mut run = mpirun_with(&check, &socket, 300, 20_000, &["-x", &preload]);
    wait_for_ranks(&server, &job, &mut run);
    let plan = move_vm2(&job, "evacuate");
    let mut mig = Recorder { moved: Vec::new() };
    let outcome = run_plan(&mut db, &server, &mut mig, &plan, &CANCEL_AFTER_60S).unwrap();
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    let out = std::mem::replace(&mut run.0, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "MPI job failed");
    assert!(
        stdout.contains("MPICHECK ranks=4 steps=300 messages=6000 bad=0"),
        "{stdout}"
    );
    let held: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("held at a barrier"))
        .collect();
    assert_eq!(
        held,
        ["vse-barrier: rank 2 held at a barrier while its VM migrated (1)"]
    );
    assert_eq!(mig.moved.len(), 1);
}

fn node_sample(node: &str, ratio: f64, ts_ms: u64) -> monitor::Sample {
    let total = 16u64 << 20;
    let active = (total as f64 * ratio) as u64;
    monitor::Sample::Node(monitor::NodeSample {
        ts_ms,
        job: Some(JobId::new("job1").unwrap()),
        node: nm(node),
        mem: monitor::MemInfo {
            total_kib: total,
            active_kib: active,
            available_kib: total - active,
        },
        cpu: vec![],
    })
}

/// Scenario (a) of the issue, with the daemon in the loop: samples flow into the controller
/// state, a memory hog appears on one node of the 4-node MPI job, the daemon predicts the
/// failure (threshold + leave-one-out outlier + persistence), the coordinator migrates that
/// node's VM at a barrier, the node ends defunct and the MPI job verifies every message.
#[test]
fn daemon_detects_hog_and_migrates_mpi_rank_at_barrier() {
    let dir = tempfile::tempdir().unwrap();
    let Some(ring) = build_ring(dir.path()) else {
        return;
    };
    let socket = dir.path().join("barrier.sock");
    let server = BarrierServer::bind(&socket).unwrap();
    let (job, mut db) = four_vm_job(dir.path(), 2 << 20);
    let mut run = mpirun(&ring, &socket, 400, 20_000);
    wait_for_ranks(&server, &job, &mut run);
    let mut daemon = Daemon::new(MigrationConfig::default()).unwrap();
    let mut mig = Recorder { moved: Vec::new() };
    let mut outcomes = Vec::new();
    for round in 0..20u64 {
        // Healthy noise on every node; from round 5 on, a hog outside the job fills n3.
        let samples: Vec<_> = (0..4)
            .map(|i| {
                let noise = ((round * 7 + i * 13) % 5) as f64 / 100.0 - 0.02;
                let hog = if i == 3 && round >= 5 { 0.4 } else { 0.0 };
                node_sample(&format!("n{i}"), 0.45 + noise + hog, round * 1000)
            })
            .chain(std::iter::once(node_sample("f0", 0.05, round * 1000)))
            .collect();
        db.record_samples(&samples).unwrap();
        let view = db.cluster_view(round * 1000).unwrap();
        for plan in daemon.evaluate(&view) {
            assert!(
                round >= 7,
                "persistence: not before 3 hog samples (round {round})"
            );
            let cfg = MigrationConfig::default().barrier;
            outcomes.push(run_plan(&mut db, &server, &mut mig, &plan, &cfg).unwrap());
        }
    }
    assert_eq!(outcomes.len(), 1, "exactly one migration: {outcomes:?}");
    assert!(
        matches!(outcomes[0], Outcome::Completed { .. }),
        "{outcomes:?}"
    );
    let out = std::mem::replace(&mut run.0, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "MPI job failed");
    for r in 0..4 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {r} ")))
            .expect("rank line");
        assert!(line.contains("received 400 errors 0"), "{line}");
        assert!(
            line.ends_with(&format!("migrations {}", u32::from(r == 3))),
            "{line}"
        );
    }
    assert_eq!(
        mig.moved,
        vec![(VmId::new("vm3").unwrap(), nm("n3"), nm("f0"))]
    );
    let nodes = db.nodes().unwrap();
    let pool = |n: &str| nodes.iter().find(|x| x.name.as_str() == n).unwrap().pool;
    assert_eq!(pool("n3"), Pool::Defunct);
    assert_eq!(pool("f0"), Pool::Allocated);
}
