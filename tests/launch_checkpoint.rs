//! Job checkpoints end to end with the real binary, real agents and real TCG VMs (`local:2`):
//! a counting job is checkpointed when its walltime ends (a policy rule), resumed by running
//! the same command line again, checkpointed on request and then preempted (SIGTERM), and
//! finally restored with `--restore`: across the three launches every rank prints every
//! number exactly once, and writes it once, in order, to its file in a shared host directory
//! through a descriptor its shell holds open across every checkpoint and restore; the
//! finished job leaves no checkpoint behind. A damaged or incomplete checkpoint is refused (exit 2) and left as it
//! was.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::vm::{built_image, no_qemu_left, vm_slot, vm_tools};
use support::{counts, follow};

const VSE: &str = env!("CARGO_BIN_EXE_vse");
/// More than any of the runs gets to: the job never ends by itself.
const COUNT: u32 = 100_000;

fn count_cmd() -> String {
    format!(
        "exec 3>>/results/rank-$VSE_RANK.log; i=0; while [ $i -lt {COUNT} ]; do i=$((i+1)); echo $i; echo $i >&3; sleep 0.1; done"
    )
}

struct Job {
    img: PathBuf,
    dir: PathBuf,
    cache: PathBuf,
    run: PathBuf,
    policy: PathBuf,
    /// Shared with the VMs at /results.
    results: PathBuf,
}

impl Job {
    fn launch(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(VSE);
        c.arg("launch")
            .arg(&self.img)
            .args(["--allocation", "local:2", "--job", "ckcount"])
            .arg("--policy")
            .arg(&self.policy)
            .args(extra)
            .env("VSE_IMAGE_CACHE", &self.cache)
            .env("VSE_RUN_DIR", &self.run)
            .stdin(Stdio::null());
        c
    }

    /// The command line a requeued batch script would run again and again.
    fn same_line(&self) -> Command {
        // Long enough for two TCG VMs to boot on a loaded 2-core machine before the
        // checkpoint, which starts about 13 s before the end.
        let share = format!("{}:/results", self.results.display());
        let mut c = self.launch(&["--walltime", "45s", "--share", &share]);
        c.arg("--checkpoint-dir")
            .arg(&self.dir)
            .args(["--", "sh", "-c", &count_cmd()]);
        c
    }
}

fn show(o: &Output) -> (String, String) {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    eprintln!("--- stdout (tail)\n{}--- stderr\n{err}---", tail(&out));
    (out, err)
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(6)..].join("\n") + "\n"
}

fn manifest(ckpt: &Path) -> serde_json::Value {
    let body = std::fs::read(ckpt.join("checkpoint.json")).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn a_job_checkpointed_at_walltime_end_and_on_preemption_resumes_without_losing_a_number() {
    testkit::require!(vm_tools());
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("walltime.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: walltime-checkpoints\ncheckpoint:\n  at_walltime_end: true\n",
    )
    .unwrap();
    let job = Job {
        img,
        dir: tmp.path().join("ckpts"),
        cache: tmp.path().join("cache"),
        run: tmp.path().join("run"),
        policy,
        results: tmp.path().join("results"),
    };
    std::fs::create_dir(&job.results).unwrap();
    let _slot = vm_slot();

    // 0. Without an end vse can learn (no --walltime, no batch job), the policy's rule cannot
    //    be kept: refused before anything starts, naming the rule.
    let o = within(job.launch(&["--", "true"]), Duration::from_secs(60));
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("walltime.policy.yaml:4:")
            && err.contains("checkpoint.at_walltime_end")
            && err.contains("hint: give --walltime"),
        "{err}"
    );
    no_qemu_left(&job.run);

    // 1. The policy checkpoints the job before its walltime ends, and the job stops.
    let first = within(job.same_line(), Duration::from_secs(300));
    let (out1, err1) = show(&first);
    assert_eq!(first.status.code(), Some(106), "{err1}");
    assert!(err1.contains("checkpointed to"), "{err1}");
    let m1 = manifest(&job.dir.join("ckpt-1"));
    assert_eq!(m1["reason"], "walltime-end", "{m1}");
    assert_eq!(m1["ranks"].as_array().unwrap().len(), 2, "{m1}");
    no_qemu_left(&job.run);
    let before = counts(&out1);
    assert!(before.iter().all(|c| !c.is_empty()), "{before:?}");

    // 2. The same line again resumes; a requested checkpoint lets it run on, SIGTERM (the
    //    batch system preempting the job) checkpoints it again and stops it.
    let (out2, code2, err2) = run_then_preempt(job.same_line(), &before, Some(&job.run));
    assert_eq!(code2, Some(106), "{err2}");
    assert!(err2.contains("resuming from checkpoint"), "{err2}");
    assert!(err2.contains("(preempted)"), "{err2}");
    // Three checkpoints taken, the newest two kept.
    assert_eq!(kept(&job.dir), ["ckpt-2", "ckpt-3"]);
    assert_eq!(manifest(&job.dir.join("ckpt-2"))["reason"], "requested");
    assert_eq!(manifest(&job.dir.join("ckpt-3"))["reason"], "preempted");
    no_qemu_left(&job.run);

    refused_when_damaged(&job, &job.dir.join("ckpt-3"), tmp.path());

    // 3. Restored by name, it counts on, and checkpoints into the same directory.
    // (The policy's rule needs the allocation's end: a local one's is given.)
    let mut restore = job.launch(&["--walltime", "30m", "--restore"]);
    restore.arg(&job.dir);
    let so_far = counts(&format!("{out1}{out2}"));
    let (out3, code3, err3) = run_then_preempt(restore, &so_far, None);
    assert_eq!(code3, Some(106), "{err3}");
    assert_eq!(kept(&job.dir), ["ckpt-3", "ckpt-4"]);
    no_qemu_left(&job.run);
    for (r, c) in counts(&format!("{out1}{out2}{out3}")).iter().enumerate() {
        let last = *c.last().unwrap();
        assert!(last > 40, "rank {r} counted to {last} only");
        assert_eq!(
            c,
            &(1..=last).collect::<Vec<_>>(),
            "rank {r}: a number lost or repeated"
        );
        let log = std::fs::read_to_string(job.results.join(format!("rank-{r}.log"))).unwrap();
        let written: Vec<u32> = log.lines().map(|l| l.parse().unwrap()).collect();
        let n = written.len() as u32;
        assert_eq!(
            written,
            (1..=n).collect::<Vec<_>>(),
            "rank {r}'s file: {log}"
        );
        // The file's line comes after the printed one: a stop between them leaves it one short.
        assert!(
            n + 1 >= last,
            "rank {r}'s file ends at {n}, its output at {last}"
        );
    }
}

/// The complete checkpoints in `dir`.
fn kept(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `cmd` to its end, or kills it after `limit` and fails.
fn within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(limit) {
        Ok(o) => o,
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("vse launch did not end within {limit:?}");
        }
    }
}

/// Runs `cmd`; once both ranks printed ten more numbers than `before`, asks for a checkpoint
/// (`vse checkpoint --job`, the run directory `ask`) if asked to, and once they printed twenty more, sends SIGTERM.
/// Returns all output, the exit code, stderr.
fn run_then_preempt(
    mut cmd: Command,
    before: &[Vec<u32>; 2],
    ask: Option<&Path>,
) -> (String, Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (rx, reader) = follow(child.stdout.take().unwrap());
    let last = |c: &Vec<u32>| c.last().copied().unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(300);
    let mut asked = ask.is_none();
    while let Ok(so_far) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        let now = counts(&so_far);
        let ahead = |n: u32| (0..2).all(|r| last(&now[r]) >= last(&before[r]) + n);
        if !asked && ahead(10) {
            let o = Command::new(VSE)
                .args(["checkpoint", "--job", "ckcount", "--wait", "--json"])
                .env("VSE_RUN_DIR", ask.unwrap())
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["request"]["state"], "done", "{v}");
            asked = true;
        }
        if asked && ahead(20) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            break;
        }
    }
    assert!(asked, "the resumed job never got going");
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let out = reader.join().unwrap();
    eprintln!(
        "--- resumed stdout (tail)\n{}--- stderr\n{err}---",
        tail(&out)
    );
    (out, status.code(), err)
}

/// A checkpoint with a flipped byte, or one never completed, is refused with exit 2 before
/// anything starts, and its files are left as they were.
fn refused_when_damaged(job: &Job, good: &Path, tmp: &Path) {
    let bad = tmp.join("damaged").join("ckpt-3");
    std::fs::create_dir_all(&bad).unwrap();
    for e in std::fs::read_dir(good).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.join(e.file_name())).unwrap();
    }
    let state = bad.join("ckcount-r1.state");
    let mut bytes = std::fs::read(&state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&state, &bytes).unwrap();
    let o = job.launch(&["--restore"]).arg(&bad).output().unwrap();
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ckcount-r1.state") && err.contains("SHA256"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&state).unwrap(),
        bytes,
        "the damaged file is left alone"
    );

    let partial = tmp.join("damaged").join(".partial-4-1");
    std::fs::create_dir_all(&partial).unwrap();
    let o = job.launch(&["--restore"]).arg(&partial).output().unwrap();
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("incomplete checkpoint"), "{err}");
}

/// An MPI job under `sbatch --requeue`: `scontrol requeue` signals every process of the job
/// (the batch script, the node agents' steps, QEMU); vse checkpoints it within Slurm's
/// KillWait and exits 106, its ranks held at an `MPI_Barrier`; Slurm runs the batch script
/// again, which resumes from the checkpoint and releases the ranks, and mpicheck's ring and
/// all-to-all messages all arrive; each rank's line per step, appended to its file in a
/// shared host directory through a descriptor held across the requeue, is there once.
#[test]
fn an_mpi_job_requeued_by_slurm_resumes_from_its_checkpoint_without_losing_a_message() {
    testkit::require!(vm_tools() && testkit::tool("sbatch") && testkit::tool("scontrol"));
    testkit::require!(
        testkit::is_root(),
        "root",
        "the Slurm test cluster of .ci/slurm-up.sh is started as root"
    );
    let Some(check) = testkit::fixture::env_file("VSE_MPICHECK", "mpicheck.sh") else {
        return;
    };
    let Some(img) =
        support::vm::built_image_with("mpi-lammps.vse.yaml", "mpicheck", &[("mpicheck", &check)])
    else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/slurm-up.sh");
    let up = Command::new("sh").arg(script).output().unwrap();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let conf =
        std::env::var("VSE_SLURM_DIR").unwrap_or_else(|_| "/tmp/vse-slurm".into()) + "/slurm.conf";
    let tmp = tempfile::tempdir().unwrap();
    let (out, dir) = (tmp.path().join("job.out"), tmp.path().join("ckpts"));
    let results = tmp.path().join("results");
    std::fs::create_dir(&results).unwrap();
    let steps = 300;
    let job_line = format!(
        "#!/bin/sh\nexec {VSE} launch {} --allocation slurm --mpi --memory 384 --job ckmpi \
         --checkpoint-dir {} --share {}:/results \
         -- sh -c 'echo started; exec /usr/local/bin/mpicheck {steps} 50000 /results'\n",
        img.display(),
        dir.display(),
        results.display()
    );
    std::fs::write(tmp.path().join("job.sh"), job_line).unwrap();
    let _slot = vm_slot();
    let slurm = |args: &[&str]| {
        let o = Command::new(args[0])
            .args(&args[1..])
            .env("SLURM_CONF", &conf)
            .env("VSE_IMAGE_CACHE", tmp.path().join("cache"))
            .env("VSE_RUN_DIR", tmp.path().join("run"))
            .env("VSE_NODES_SHARE_MACHINE", "1")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let id = slurm(&[
        "sbatch",
        "--parsable",
        "--requeue",
        "-N",
        "2",
        "--time=10",
        "--open-mode=append",
        "-o",
        &out.to_string_lossy(),
        &tmp.path().join("job.sh").to_string_lossy(),
    ]);
    let _cancel = Cancel(id.clone(), conf.clone());
    let text = || std::fs::read_to_string(&out).unwrap_or_default();
    // Both ranks' processes started (mpirun runs the `sh -c` in each), then a few seconds
    // of messages.
    wait_for(
        Duration::from_secs(240),
        || text().matches("started").count() >= 2,
        &text,
    );
    std::thread::sleep(Duration::from_secs(4));
    slurm(&["scontrol", "requeue", &id]);
    wait_for(
        Duration::from_secs(60),
        || dir.join("ckpt-1/checkpoint.json").is_file(),
        &text,
    );
    // The ranks were saved waiting at a barrier: no MPI message was in flight. The second
    // run must release them from it (else mpicheck never ends).
    let m = manifest(&dir.join("ckpt-1"));
    assert!(m["cut"]["barrier"]["notice"].is_i64(), "cut: {}", m["cut"]);
    for r in m["ranks"].as_array().unwrap() {
        let conns = r["saved"]["barrier"].as_array().unwrap();
        assert!(
            !conns.is_empty(),
            "rank {} has no barrier connection",
            r["rank"]
        );
    }
    // Slurm holds a requeued job back for a while; start it now.
    wait_for(
        Duration::from_secs(60),
        || state(&slurm, &id) == "PENDING",
        &text,
    );
    slurm(&[
        "scontrol",
        "update",
        &format!("jobid={id}"),
        "StartTime=now",
    ]);
    wait_for(
        Duration::from_secs(300),
        || state(&slurm, &id).is_empty(),
        &text,
    );
    let all = text();
    eprintln!("--- job output (without rank lines)");
    for l in all.lines().filter(|l| !l.starts_with("[rank")) {
        eprintln!("{l}");
    }
    assert!(
        all.contains("(preempted) and stopped"),
        "the first run checkpointed"
    );
    assert!(
        all.contains("resuming from checkpoint"),
        "the second run resumed"
    );
    let messages = steps * 2 * 3;
    let want = format!("[rank 0] MPICHECK ranks=2 steps={steps} messages={messages} bad=0");
    assert!(all.contains(&want), "{want} not in the output");
    assert_eq!(
        all.matches("MPICHECK").count(),
        1,
        "mpicheck ran once, across both runs"
    );
    for rank in 0..2 {
        let log = std::fs::read_to_string(results.join(format!("rank-{rank}.log"))).unwrap();
        let want: String = (0..steps)
            .map(|s| format!("rank {rank} step {s}\n"))
            .collect();
        assert!(
            log == want,
            "rank {rank}'s file lost, repeated or reordered lines:\n{log}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(
        left.is_empty(),
        "the finished job removed its checkpoints: {left:?}"
    );
    no_qemu_left(&tmp.path().join("run"));
}

/// The job's Slurm state (`PENDING`, `RUNNING`, ...), empty once it is gone.
fn state(slurm: &impl Fn(&[&str]) -> String, id: &str) -> String {
    slurm(&["squeue", "-h", "-j", id, "-o", "%T"])
}

fn wait_for(within: Duration, done: impl Fn() -> bool, show: &impl Fn() -> String) {
    let end = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < end,
            "timed out after {within:?}; output so far:\n{}",
            show()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Cancels the Slurm job when the test ends, however it ends.
struct Cancel(String, String);

impl Drop for Cancel {
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .arg(&self.0)
            .env("SLURM_CONF", &self.1)
            .output();
    }
}

/// A spec launched as a spec: what its fields and the policy's defaults say is what the VMs
/// get. `resources.vcpus` is the guest's CPU count; a spec without `resources.memory` gets the
/// policy's `defaults.memory`; `checkpoint.mode: periodic` checkpoints every
/// `checkpoint.interval`, and one shorter than the policy's `checkpoint.min_interval` is
/// refused before anything is built; and
/// `hypervisor:` (the spec's, else the policy's `defaults.hypervisor`) is the one the node
/// starts the VM with (Xen here, which this host lacks: the node says so). The policy's
/// `cache.max_age` empties the node's image cache of what no job used for longer.
#[test]
fn a_spec_s_sizes_checkpoints_and_hypervisor_are_what_its_launch_does() {
    testkit::require!(vm_tools());
    if !support::host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(support::specs().join("minimal.vse.yaml")).unwrap();
    let base = base
        .replace("\nname: minimal", "\nname: launch-fields")
        .replace("  vcpus: 1\n  memory: 256MiB\n", "  vcpus: 2\n");
    assert!(!base.contains("memory:"), "{base}");
    let spec = tmp.path().join("fields.vse.yaml");
    std::fs::write(
        &spec,
        format!("{base}checkpoint:\n  mode: periodic\n  interval: 6s\n"),
    )
    .unwrap();
    let policy = tmp.path().join("defaults.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: defaults\nhypervisors:\n  allowed: [qemu, xen]\n\
         defaults:\n  memory: 320MiB\ncheckpoint:\n  min_interval: 5s\ncache:\n  max_age: 2d\n",
    )
    .unwrap();
    let (cache, run) = (tmp.path().join("cache"), tmp.path().join("run"));
    // An image no job has used for three days.
    let stale = cache.join("0000-unused-image");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("root.ext4"), vec![1u8; 1 << 20]).unwrap();
    for d in [&cache, &stale] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let three_days = std::time::SystemTime::now() - Duration::from_secs(3 * 86_400);
    std::fs::File::open(&stale)
        .unwrap()
        .set_modified(three_days)
        .unwrap();
    let launch = |spec: &Path, policy: &Path, cmd: &str| {
        let mut c = Command::new(VSE);
        c.arg("launch")
            .arg(spec)
            .arg("--policy")
            .arg(policy)
            .args(["--allocation", "local:1", "--json", "--checkpoint-dir"])
            .arg(tmp.path().join("ckpts"))
            .args(["--", "sh", "-c", cmd])
            .env("VSE_IMAGE_CACHE", &cache)
            .env("VSE_RUN_DIR", &run)
            .stdin(Stdio::null());
        within(c, Duration::from_secs(600))
    };
    let _slot = vm_slot();
    let o = launch(
        &spec,
        &policy,
        "echo cpus $(nproc) mem $(awk '/^MemTotal/ {print $2}' /proc/meminfo); sleep 20",
    );
    let (out, err) = show(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
    let stdout = report["ranks"][0]["stdout"].as_str().unwrap_or_default();
    let line = (stdout.lines())
        .find_map(|l| l.strip_prefix("cpus "))
        .unwrap_or_else(|| panic!("no sizes in {report}"));
    let (cpus, kib) = line.split_once(" mem ").unwrap();
    assert_eq!(cpus, "2", "{line}");
    let kib: u64 = kib.trim().parse().unwrap();
    // 320 MiB less what the guest's kernel keeps, above the 256 MiB it would otherwise get.
    assert!((257 * 1024..=320 * 1024).contains(&kib), "{kib} KiB");
    assert!(
        !stale.exists(),
        "the unused image is still in the node's cache"
    );
    let images = std::fs::read_dir(&cache).unwrap().flatten();
    let kept: Vec<_> = images
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert_eq!(kept.len(), 1, "the job's own image stays: {kept:?}");
    let taken = report["checkpoints"].as_array().unwrap();
    assert!(taken.len() >= 2, "{report}");
    let ms = |c: &serde_json::Value, k: &str| c[k].as_u64().unwrap();
    for (a, b) in taken.iter().zip(&taken[1..]) {
        assert_eq!(b["reason"], "periodic", "{report}");
        let gap = ms(b, "started_ms") - ms(a, "started_ms") - ms(a, "duration_ms");
        assert!(gap >= 5_900, "{gap} ms between checkpoints: {report}");
    }
    no_qemu_left(&run);
    let often = tmp.path().join("often.vse.yaml");
    std::fs::write(
        &often,
        format!("{base}checkpoint:\n  mode: periodic\n  interval: 3s\n"),
    )
    .unwrap();
    let o = launch(&often, &policy, "true");
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("checkpoint.interval = 3s is shorter than the policy allows")
            && err.contains("checkpoint.min_interval = 5s"),
        "{err}"
    );

    // The hypervisor: the spec's, or where it names none, the policy's default.
    let xen_spec = tmp.path().join("xen.vse.yaml");
    std::fs::write(&xen_spec, format!("{base}hypervisor: xen\n")).unwrap();
    let xen_default = tmp.path().join("xen-default.policy.yaml");
    std::fs::write(
        &xen_default,
        "version: 1\nname: xen-default\nhypervisors:\n  allowed: [qemu, xen]\n\
         defaults:\n  hypervisor: xen\n",
    )
    .unwrap();
    for (spec, policy) in [(&xen_spec, &policy), (&spec, &xen_default)] {
        let o = launch(spec, policy, "true");
        let (out, err) = show(&o);
        assert_eq!(o.status.code(), Some(103), "{err}");
        // The node's answer, in the JSON report's failures.
        assert!(out.contains("xen is not available on this host"), "{out}");
    }
    no_qemu_left(&run);
}
