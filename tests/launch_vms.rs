//! `vse launch` end to end with the real binary, real agents, real staging and real TCG VMs:
//! `local:2` on this machine, then 3 nodes of a real Slurm allocation (`salloc`). Each rank
//! prints and exits with its own status; the job must print every rank's prefixed output,
//! exit with the lowest failing rank's status, and leave no QEMU behind.
//!
//! The image: `VSE_TEST_IMAGE` (a directory from `vse build`) if set, else the minimal spec
//! is built here (needs VSE_GUEST_AGENT, as in tests/build_cli.rs).

mod support;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};
use support::vm::{accel_note, built_image, vm_slot, vm_tools};
use testkit::process::{alive, cmdline, parent, pids_with};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// A bootable image: the prebuilt one named by VSE_TEST_IMAGE, or the minimal spec built
/// once for all VM tests.
fn image() -> Option<PathBuf> {
    match std::env::var_os("VSE_TEST_IMAGE") {
        Some(p) => Some(PathBuf::from(p)),
        None => built_image("minimal.vse.yaml"),
    }
}

/// Every QEMU started under `run_dir` has exited by the time `vse launch` has.
fn no_qemu_left(run_dir: &Path) {
    testkit::process::assert_no_qemu_left(run_dir, std::time::Duration::ZERO);
}

fn show(o: &Output) -> (String, String) {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    eprintln!("--- stdout\n{out}--- stderr\n{err}---");
    (out, err)
}

const RANK_CMD: &str = "echo hi $VSE_RANK of $VSE_SIZE; echo hosts=$VSE_HOSTS; echo warn $VSE_RANK >&2; exit $((VSE_RANK + 3))";

#[test]
fn local_two_nodes_prefixed_output_and_exit_status() {
    if !vm_tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(img) = image() else { return };
    let _slot = vm_slot();
    let (cache, run) = (tmp.path().join("cache"), tmp.path().join("run"));
    let launch_with = |extra: &[&str], cmd: &str, input: &[u8]| {
        let mut child = Command::new(VSE)
            .arg("launch")
            .arg(&img)
            .args(["--allocation", "local:2"])
            .args(extra)
            .args(["--", "sh", "-c", cmd])
            .env("VSE_IMAGE_CACHE", &cache)
            .env("VSE_RUN_DIR", &run)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            stdin.write_all(&input)
        });
        let o = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        o
    };
    let launch = |extra: &[&str], cmd: &str| launch_with(extra, cmd, b"");
    let o = launch(&[], RANK_CMD);
    let (out, err) = show(&o);
    accel_note(&run);
    // Rank 0 exits 3 and rank 1 exits 4: the lowest failing rank decides.
    assert_eq!(o.status.code(), Some(3), "{err}");
    for r in 0..2 {
        assert!(out.contains(&format!("[rank {r}] hi {r} of 2\n")), "{out}");
        assert!(err.contains(&format!("[rank {r}] warn {r}\n")), "{err}");
    }
    let hosts = out
        .lines()
        .find_map(|l| l.strip_prefix("[rank 0] hosts="))
        .expect("VSE_HOSTS line");
    assert_eq!(hosts.split(',').count(), 2, "{hosts}");
    no_qemu_left(&run);

    // The first boot of the image on this "node" saved its boot template (one, though two
    // VMs booted at once).
    let templates: Vec<_> = std::fs::read_dir(cache.join(".templates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("meta.json").is_file())
        .collect();
    assert_eq!(templates.len(), 1, "{err}");

    // Again with --json: both agents share this machine's cache, so nothing is sent, and
    // both VMs start from the template (a template that fails says so and boots cold). This
    // process's standard input reaches rank 0's command, its end too; rank 1 reads none.
    let input: String = (0..3000).map(|i| format!("input line {i}\n")).collect();
    let o = launch_with(&["--json"], "cat; echo ok $VSE_RANK", input.as_bytes());
    let (out, err) = show(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(!err.contains("boot template"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
    assert_eq!(v["exit_code"], 0);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["status"], 0, "{r}");
        let read = if i == 0 { input.as_str() } else { "" };
        assert_eq!(r["stdout"], format!("{read}ok {i}\n"));
    }
    // Distinct cores for the two VMs sharing this machine.
    assert_ne!(ranks[0]["cpus"], ranks[1]["cpus"], "{v}");
    // Each rank says where its time went on its node; the parts fit in the launch's wall time.
    let done = (v["timeline"].as_array().unwrap().iter())
        .find(|m| m["phase"] == "done")
        .and_then(|m| m["at_ms"].as_u64())
        .expect("a `done` mark");
    for r in ranks {
        let t = &r["times"];
        let part = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("times.{k}: {r}"));
        // From a template the guest answers at once; its hypervisor still had to start.
        assert!(part("vm_start_ms") > 0, "{r}");
        assert_eq!(t["boot"], "from-template", "{r}");
        let sum: u64 = ["vm_start_ms", "guest_ms", "run_ms", "stop_ms"]
            .map(part)
            .iter()
            .sum();
        assert!(sum <= done, "rank times {t} exceed the launch's {done} ms");
    }
    for n in v["staging"]["nodes"].as_array().unwrap() {
        assert_eq!(n[1]["outcome"], "cached", "{n}");
    }
    no_qemu_left(&run);

    // A policy without boot templates: the same launch boots both VMs from their kernel.
    let policy = tmp.path().join("cold.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: cold\nimages:\n  boot_templates: false\n",
    )
    .unwrap();
    let o = launch(
        &["--json", "--policy", policy.to_str().unwrap()],
        "echo ok $VSE_RANK",
    );
    let (out, err) = show(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
    for r in v["ranks"].as_array().unwrap() {
        assert_eq!(r["times"]["boot"], "cold", "{r}");
    }
    no_qemu_left(&run);
}

#[test]
fn slurm_allocation_of_three_nodes_boots_vms() {
    testkit::require!(vm_tools() && testkit::tool("salloc"));
    testkit::require!(
        testkit::is_root(),
        "root",
        "the Slurm test cluster of .ci/slurm-up.sh is started as root"
    );
    let tmp = tempfile::tempdir().unwrap();
    let Some(img) = image() else { return };
    let _slot = vm_slot();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/slurm-up.sh");
    let up = Command::new("sh").arg(script).output().unwrap();
    assert!(
        up.status.success(),
        "slurm-up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let conf = std::env::var("VSE_SLURM_DIR").unwrap_or_else(|_| "/tmp/vse-slurm".to_string())
        + "/slurm.conf";
    let run = tmp.path().join("run");
    // VMs the job's memory on a node cannot hold are refused before any agent starts, for an
    // ordinary user as for root.
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let o = t
        .command("salloc")
        .args(["-N", "1", "--mem=300", "--time=10"])
        .arg(VSE)
        .arg("launch")
        .arg(&img)
        .args([
            "--allocation",
            "slurm",
            "--memory",
            "256",
            "--vms-per-node",
            "2",
        ])
        .args(["--", "true"])
        .env("SLURM_CONF", &conf)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lets this job use 300 MiB there")
            && err.contains(&format!(
                "2 x (256 MiB + {} MiB for the hypervisor)",
                vmhost::fit::HYPERVISOR_OVERHEAD_MIB
            )),
        "{err}"
    );
    let name = format!("vse-acct-{}", std::process::id());
    let mut child = Command::new("salloc")
        .args(["-N", "3", "--time=10", "-J", &name])
        .arg(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "slurm", "--", "sh", "-c"])
        .arg(format!("{RANK_CMD_SLOW}; {RANK_CMD}"))
        .env("SLURM_CONF", &conf)
        .env("VSE_IMAGE_CACHE", tmp.path().join("cache"))
        .env("VSE_RUN_DIR", &run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the ranks run: each QEMU is inside a step of the job (its node agent's, started
    // by srun), so Slurm bounds, accounts and kills it with the job.
    let run_s = run.to_string_lossy().into_owned();
    let t0 = std::time::Instant::now();
    let qemu = loop {
        let q = pids_with(&["qemu", &run_s]);
        if q.len() == 3 || child.try_wait().unwrap().is_some() {
            break q;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(180),
            "3 VMs never ran: {q:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let cgroups: Vec<String> = qemu
        .iter()
        .map(|p| std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default())
        .collect();
    let o = child.wait_with_output().unwrap();
    let (out, err) = show(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    for r in 0..3 {
        assert!(out.contains(&format!("[rank {r}] hi {r} of 3\n")), "{out}");
    }
    assert_eq!(qemu.len(), 3, "{cgroups:?}");
    for cg in &cgroups {
        for h in [":memory:", ":freezer:", ":cpuacct:"] {
            let line = cg.lines().find(|l| l.contains(h)).unwrap_or_default();
            assert!(
                line.contains("/job_") && line.contains("/step_"),
                "a QEMU outside its job's {h} step cgroup:\n{cg}"
            );
        }
    }
    no_qemu_left(&run);
    // Slurm's accounting counts each VM with its node agent's step: every agent step's peak
    // memory holds a booted guest (a node agent alone stays well under 64 MiB).
    let t0 = std::time::Instant::now();
    let peaks = loop {
        let o = Command::new("sacct")
            .args(["-n", "-P", "--name", &name, "--format=JobID,MaxRSS"])
            .env("SLURM_CONF", &conf)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        // The agents' steps: `JOB.N` (not `.extern`, `.interactive`).
        let peaks: Vec<u64> = (text.lines())
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                let step = f.first()?.split_once('.')?.1;
                step.parse::<u32>().ok()?;
                let kib = f.get(1)?.strip_suffix('K')?.parse::<u64>().ok()?;
                Some(kib << 10)
            })
            .collect();
        if peaks.len() >= 3 {
            break peaks;
        }
        // slurmctld hands finished steps to slurmdbd in the background: on a loaded 2-core
        // machine that has taken over 30 s.
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "no accounting of the agents' steps: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(
        peaks.iter().filter(|&&p| p > 100 << 20).count() >= 3,
        "the agents' steps do not hold their VMs: {peaks:?}"
    );
}

/// Keeps a rank's VM running a few seconds, long enough to find its QEMU from the host.
const RANK_CMD_SLOW: &str = "sleep 4";

#[test]
fn bad_requests_are_refused_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(VSE)
            .arg("launch")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let dir = tmp.path().to_str().unwrap();
    let (code, err) = run(&[dir, "--allocation", "local:1", "--", "true"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("manifest.json"), "{err}");
    // mpirun needs the job network.
    let (code, err) = run(&[dir, "--mpi", "--no-network", "--", "true"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--no-network") && err.contains("--mpi"),
        "{err}"
    );
    let (code, err) = run(&[dir, "--hypervisor", "vmware", "--", "true"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("expected auto, qemu or libvirt"), "{err}");
    // libvirtd's QEMU would run outside the batch job's cgroups.
    for alloc in ["slurm", "pbs"] {
        let (code, err) = run(&[
            dir,
            "--allocation",
            alloc,
            "--hypervisor",
            "libvirt",
            "--",
            "true",
        ]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(&format!("--hypervisor libvirt with --allocation {alloc}"))
                && err.contains("outside the batch job's cgroups")
                && err.contains("hint: use --hypervisor qemu"),
            "{err}"
        );
    }
    // Migration needs VMs the node agents move themselves: libvirt's are refused up front.
    let site = support::specs().join("site.policy.yaml");
    let site = site.to_str().unwrap();
    let (code, err) = run(&[
        dir,
        "--policy",
        site,
        "--hypervisor",
        "libvirt",
        "--allocation",
        "local:1",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--hypervisor libvirt: the policy's migration section")
            && err.contains("hint: use --hypervisor qemu"),
        "{err}"
    );
    // A site's walltime checkpoint needs the allocation's end: without one the launch is
    // refused naming the policy's line; with --walltime it goes on (to the missing manifest).
    let walltime = tmp.path().join("walltime.policy.yaml");
    std::fs::write(
        &walltime,
        "version: 1\nname: saves\ncheckpoint:\n  at_walltime_end: true\n",
    )
    .unwrap();
    let walltime = walltime.to_str().unwrap();
    let (code, err) = run(&[
        dir,
        "--policy",
        walltime,
        "--allocation",
        "local:1",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{walltime}:4:20: checkpoint.at_walltime_end requires a checkpoint before the allocation ends"
        )) && err.contains("hint: give --walltime"),
        "{err}"
    );
    let (code, err) = run(&[
        dir,
        "--policy",
        walltime,
        "--allocation",
        "local:1",
        "--walltime",
        "1h",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("manifest.json"), "{err}");
}

#[test]
fn killed_node_agent_tears_the_job_down() {
    if !vm_tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(img) = image() else { return };
    let _slot = vm_slot();
    let (cache, run) = (tmp.path().join("cache"), tmp.path().join("run"));
    let mut child = Command::new(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "local:2", "--", "sleep", "600"])
        .env("VSE_IMAGE_CACHE", &cache)
        .env("VSE_RUN_DIR", &run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_s = run.to_string_lossy().into_owned();
    let t0 = std::time::Instant::now();
    // Both VMs running: then SIGKILL node agent 2 (a leaf of the tree).
    while pids_with(&["qemu", &run_s]).len() < 2 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(300),
            "VMs did not start"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "vse launch ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    // This job's node agents: children of the launch process.
    let agents: Vec<(u32, bool)> = pids_with(&["agent", "--id", "--parent"])
        .into_iter()
        .filter(|&p| parent(p) == Some(child.id()))
        .map(|p| {
            let args = cmdline(p).unwrap_or_default();
            (p, args.windows(2).any(|w| w[0] == "--id" && w[1] == "2"))
        })
        .collect();
    assert_eq!(agents.len(), 2, "this job's agents: {agents:?}");
    let victims: Vec<u32> = agents.iter().filter(|a| a.1).map(|a| a.0).collect();
    assert_eq!(victims.len(), 1, "agent 2 of this job: {victims:?}");
    Command::new("kill")
        .args(["-KILL", &victims[0].to_string()])
        .status()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("vse launch did not end after its agent was killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let o = child.wait_with_output().unwrap();
    let (_, err) = show(&o);
    assert_eq!(status.code(), Some(101), "{err}");
    assert!(
        err.contains("agent2"),
        "the report names the dead node: {err}"
    );
    // Agent 1's VM is stopped by its teardown, agent 2's by its parent-death signal.
    testkit::process::assert_no_qemu_left(&run, std::time::Duration::from_secs(15));
    for (pid, _) in &agents {
        assert!(!alive(*pid), "agent process {pid} outlived the job");
    }
}

/// As an ordinary user: a command runs as the user in the guest, and `--guest-root` is refused
/// (exit 2, naming `users.allow_root`) unless a site policy grants it; a grant in the user's
/// own `--policy` is refused too. Under a site that grants it, the command runs as root.
#[test]
fn guest_root_runs_only_where_a_site_policy_grants_it() {
    if !vm_tools() || !testkit::tool("setpriv") || !testkit::tool("unshare") {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = image() else { return };
    let scratch = t.scratch("guest-root");
    let run_dir = scratch.path().join("run");
    let grant = "version: 1\nname: site\nusers:\n  allow_root: true\n";
    let mine = scratch.path().join("mine.policy.yaml");
    t.write(&mine, grant);
    let img = img.to_str().unwrap();
    let run = |c: &mut Command, extra: &[&str]| {
        let o = c
            .arg("run")
            .arg(img)
            .args(extra)
            .args(["--", "id", "-u"])
            .env("VSE_RUN_DIR", &run_dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (out, err) = show(&o);
        (o.status.code(), out, err)
    };
    let (code, out, err) = run(&mut t.command(VSE), &["--guest-root"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("--guest-root: the job's command runs as its user")
            && err.contains("users.allow_root, which is false (default)"),
        "{err}"
    );
    let mut launch = t.command(VSE);
    let o = launch
        .args([
            "launch",
            img,
            "--allocation",
            "local:1",
            "--guest-root",
            "--policy",
        ])
        .arg(&mine)
        .args(["--", "id", "-u"])
        .env("VSE_RUN_DIR", &run_dir)
        .output()
        .unwrap();
    let (_, err) = show(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("only the site's policies grant it"), "{err}");
    let _slot = vm_slot();
    let etc = testkit::unpriv::Tester::etc_site(grant, &[]);
    let audit = site_audit_file(etc.path(), grant);
    // Refused before anything starts: too many vCPUs for the site.
    let (code, _, err) = run(
        &mut t.command_under_site(etc.path(), VSE),
        &["--vcpus", "3"],
    );
    assert_eq!(code, Some(2), "{err}");
    let (code, out, err) = run(
        &mut t.command_under_site(etc.path(), VSE),
        &["--guest-root"],
    );
    assert_eq!((code, out.as_str()), (Some(0), "0\n"), "{err}");
    no_qemu_left(&run_dir);
    // The admin reads both records back: who, the policy line that refused, the image.
    let records = audit_records(&["--file", audit.to_str().unwrap(), "--user", "vse-tester"]);
    assert_eq!(records.len(), 2, "{records:?}");
    let (refused, allowed) = (&records[0], &records[1]);
    assert_eq!(
        (refused["action"].as_str(), refused["outcome"].as_str()),
        (Some("launch"), Some("refused"))
    );
    let rule = refused["rule"].as_str().unwrap_or("");
    assert!(
        rule.contains("10-site.policy.yaml:8:14") && rule.contains("allows at most 2"),
        "{rule}"
    );
    assert_eq!(allowed["outcome"], "allowed", "{allowed}");
    assert_eq!(allowed["uid"], t.uid, "{allowed}");
    let manifest = std::fs::read(Path::new(img).join("manifest.json")).unwrap();
    let digest = format!("sha256:{}", sha256_hex(&manifest));
    assert_eq!(allowed["image"], digest.as_str(), "{allowed}");
    let site = std::fs::read(etc.path().join("vse/policy.d/10-site.policy.yaml")).unwrap();
    let policy = &allowed["policies"][0];
    assert_eq!(policy["sha256"], sha256_hex(&site).as_str(), "{allowed}");
    // Without --file: the site policy's audit.file.
    let o = Command::new(VSE)
        .args(["audit", "--user", "vse-tester"])
        .env("VSE_SITE_DIR", etc.path().join("vse"))
        .output()
        .unwrap();
    let (out, err) = show(&o);
    assert_eq!(out.lines().count(), 2, "{out}{err}");
    // Syslog holds the same records, stamped by its daemon.
    let syslog = Path::new("/var/log/vse-auth.log");
    if testkit::require(
        Path::new("/dev/log").exists() && syslog.exists(),
        "a syslog daemon on /dev/log writing facility auth to /var/log/vse-auth.log",
        "run .ci/syslog-up.sh",
    ) {
        let logged = audit_records(&["--file", syslog.to_str().unwrap(), "--user", "vse-tester"]);
        for r in [refused, allowed] {
            assert!(logged.contains(r), "{r} not in syslog: {logged:?}");
        }
    }
}

/// Adds `audit.file` to the site policy of `etc` (written from `text`): a root-owned file
/// (0622: every user appends, only root reads) in a root-owned directory.
fn site_audit_file(etc: &Path, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = etc.join("audit");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("audit.jsonl");
    std::fs::write(&file, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o622)).unwrap();
    let policy = format!(
        "{text}audit:\n  file: {}\nlimits:\n  max_vcpus: 2\n",
        file.display()
    );
    std::fs::write(etc.join("vse/policy.d/10-site.policy.yaml"), policy).unwrap();
    file
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `vse audit --json ARGS` (as root, the admin), its records.
fn audit_records(args: &[&str]) -> Vec<serde_json::Value> {
    let o = Command::new(VSE)
        .arg("audit")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let (out, err) = show(&o);
    assert!(o.status.success(), "vse audit {args:?}: {err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    doc["records"].as_array().cloned().unwrap_or_default()
}
