//! `vse launch` with monitoring and the migration daemon, end to end with the real
//! binary, real agents and real TCG VMs: `local:4 --spare-nodes 1 --node-memory 768`, so three
//! nodes run one VM each and the fourth is the free pool; each node agent keeps its VMs in a
//! memory cgroup of its own (the simulation mode). The ranks run `msgcheck` (the barrier
//! library's message-checking program, baked into the image through a spec `files:` entry).
//!
//! - No hog: the job completes, no migration happens, and `vse status` shows the job's nodes,
//!   VMs, placement and both views of every VM, while the job runs and after.
//! - A memory hog in node 1's cgroup: failure avoidance fires (threshold, leave-one-out
//!   outlier, persistence), rank 0's VM is live-migrated at a barrier to the spare node, the
//!   rank's command keeps running inside it and its result still reaches the front-end, every
//!   message arrives exactly once, node 1 ends in the defunct pool, and no QEMU is left.
//! - The status page (`vse status --serve`) of a `local:2` job whose node holds two VMs: a hog
//!   makes speculative oversubscription move one to the spare; headless Chromium renders the
//!   node cells with their ratios and the migration entry, and saves a screenshot.
//!
//! Needs VSE_GUEST_AGENT (.ci/guest-agent.sh), VSE_MSGCHECK (.ci/msgcheck.sh), the bookworm
//! lists, QEMU and a writable memory cgroup (root); the page test also Chromium.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::host_lists;
use support::status_page::{StatusServer, attr};
use support::vm::{lock, vm_slot, vm_tools};
use testkit::hog::Hog;

const VSE: &str = env!("CARGO_BIN_EXE_vse");
const NODE_MIB: u64 = 768;

/// Everything the tests need, or None after "skipped: ..." (a failure under VSE_REQUIRE_ALL).
fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let ok = vm_tools()
        && host_lists()
        && testkit::require(
            monitor::memory_cgroup_base().is_some(),
            "a writable memory cgroup",
            "run as root with the memory controller enabled",
        );
    if !ok {
        return None;
    }
    let agent = testkit::fixture::env_file("VSE_GUEST_AGENT", "guest-agent.sh")?;
    let msgcheck = testkit::fixture::env_file("VSE_MSGCHECK", "msgcheck.sh")?;
    Some((agent, msgcheck))
}

/// The minimal image plus /usr/local/bin/msgcheck, built once and shared under a lock.
fn image(agent: &Path, msgcheck: &Path) -> PathBuf {
    let shared = std::env::var_os("VSE_CACHE").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&shared).unwrap();
    let _lock = lock(&shared.join("vse-launch-migrate-image.lock"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = shared.join("vse-launch-migrate.vse.yaml");
    let base = std::fs::read_to_string(root.join("specs/minimal.vse.yaml")).unwrap();
    // A spec copies files only from its own directory.
    let copy = shared.join("vse-launch-migrate-msgcheck");
    if std::fs::read(&copy).ok() != std::fs::read(msgcheck).ok() {
        std::fs::copy(msgcheck, &copy).unwrap();
    }
    let text = format!(
        "{}files:\n  - path: /usr/local/bin/msgcheck\n    source: vse-launch-migrate-msgcheck\n    mode: \"0755\"\n",
        base.replace("name: minimal", "name: minimal-msgcheck"),
    );
    if std::fs::read_to_string(&spec).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&spec, &text).unwrap();
    }
    let img = shared.join("vse-launch-migrate-image");
    let out = Command::new(VSE)
        .arg("build")
        .arg(&spec)
        .arg("--policy")
        .arg(root.join("specs/site.policy.yaml"))
        .arg("--allow-expired")
        .arg("-o")
        .arg(&img)
        .env("VSE_GUEST_AGENT", agent)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// Failure avoidance with small persistence; oversubscription out of reach; a rank that never
/// reaches a barrier cancels the migration (so a migration here is always barrier-coordinated).
const POLICY: &str = "version: 1
name: migrate-test
description: Failure avoidance for the vse launch migration test
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
    deadline: 120s
    action: cancel
";

struct Run {
    dir: tempfile::TempDir,
    db: PathBuf,
    /// A site directory (`VSE_SITE_DIR`) whose policy names an audit file.
    site: Option<PathBuf>,
}

impl Run {
    fn new() -> Self {
        Self::with_policy(POLICY)
    }

    fn with_policy(policy: &str) -> Self {
        let dir = testkit::short_tempdir("lm");
        std::fs::write(dir.path().join("test.policy.yaml"), policy).unwrap();
        let db = dir.path().join("state.db");
        Run {
            dir,
            db,
            site: None,
        }
    }

    /// Makes the site's policy name an audit file (root's, 0622) and returns it.
    fn with_audit_file(&mut self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.path();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = p.join("audit.jsonl");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o622)).unwrap();
        let site = p.join("site");
        std::fs::create_dir_all(site.join("policy.d")).unwrap();
        let policy = format!(
            "version: 1\nname: site\naudit:\n  file: {}\n",
            file.display()
        );
        std::fs::write(site.join("policy.d/10-site.policy.yaml"), policy).unwrap();
        self.site = Some(site);
        file
    }

    /// `VSE_SITE_DIR` for a command of this run, when it has a site.
    fn site_env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        match &self.site {
            Some(s) => c.env("VSE_SITE_DIR", s),
            None => c.env_remove("VSE_SITE_DIR"),
        }
    }

    fn launch(&self, img: &Path, steps: u32) -> Child {
        self.launch_on(
            img,
            steps,
            &["--allocation", "local:4", "--spare-nodes", "1"],
        )
    }

    fn launch_on(&self, img: &Path, steps: u32, allocation: &[&str]) -> Child {
        let p = self.dir.path();
        self.site_env(&mut Command::new(VSE))
            .arg("launch")
            .arg(img)
            .args(allocation)
            .args(["--node-memory", &NODE_MIB.to_string(), "--memory", "192"])
            .arg("--policy")
            .arg(p.join("test.policy.yaml"))
            .arg("--state-db")
            .arg(&self.db)
            .arg("--monitor-hook")
            .arg(format!("cat > {}", p.join("hook.jsonl").display()))
            .arg("--export-prom")
            .arg(p.join("vse.prom"))
            .args([
                "--json",
                "--",
                "/usr/local/bin/msgcheck",
                &steps.to_string(),
                "50",
            ])
            .env("VSE_IMAGE_CACHE", p.join("cache"))
            .env("VSE_RUN_DIR", p.join("run"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn status(&self) -> Option<Value> {
        let o = Command::new(VSE)
            .args(["status", "--json", "--db"])
            .arg(&self.db)
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| serde_json::from_slice(&o.stdout).ok())
            .flatten()
    }

    /// Waits until the job's three VMs have a sample with both views (the guests run their
    /// ranks).
    fn wait_running(&self, child: &mut Child) -> Value {
        self.wait_vms(child, 3)
    }

    fn wait_vms(&self, child: &mut Child, vms: usize) -> Value {
        let start = Instant::now();
        loop {
            if let Some(s) = self.status() {
                let with_guest = s["samples"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| {
                        x["kind"] == "vm" && x["guest"].is_object() && x["host"].is_object()
                    })
                    .count();
                if with_guest == vms {
                    return s;
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("vse launch ended early with {st}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "no sample with both views of every VM: {:?}",
                self.status()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Which accelerator the VMs used: V2M's functional KVM check, cached in the run dir.
    fn accel_note(&self) {
        let f = self.dir.path().join("run/.kvm-check.json");
        let v: Value = std::fs::read_to_string(&f)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let accel = if v["usable"] == true { "KVM" } else { "TCG" };
        eprintln!("accelerator: {accel} ({})", v["reason"]);
    }

    fn no_qemu_left(&self) {
        testkit::process::assert_no_qemu_left(self.dir.path(), Duration::ZERO);
    }
}

fn finish(child: Child) -> (i32, Value, String) {
    let o = child.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    eprintln!("--- stdout\n{out}--- stderr\n{err}---");
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v, err)
}

/// The summary line of a rank's msgcheck.
fn summary(report: &Value, rank: usize) -> String {
    let out = report["ranks"][rank]["stdout"].as_str().unwrap_or_default();
    out.lines()
        .find(|l| l.starts_with("MSGCHECK "))
        .unwrap_or_else(|| panic!("rank {rank}: no MSGCHECK line in {out:?}"))
        .to_string()
}

fn pool(status: &Value, node: &str) -> String {
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == node)
        .unwrap_or_else(|| panic!("node {node} not in {status}"))["pool"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn bad_monitoring_options_are_refused_before_anything_starts() {
    let Some((agent, msgcheck)) = prerequisites() else {
        return;
    };
    let img = image(&agent, &msgcheck);
    let run = |args: &[&str]| {
        let o = Command::new(VSE)
            .arg("launch")
            .arg(&img)
            .args(args)
            .args(["--", "true"])
            // A shell inside the namespace test cluster says its nodes share this machine.
            .env_remove("VSE_NODES_SHARE_MACHINE")
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[
        "--allocation",
        "hostfile:/nonexistent",
        "--node-memory",
        "512",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--node-memory is the simulation mode"),
        "{err}"
    );
    let (code, err) = run(&["--allocation", "local:2", "--spare-nodes", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--spare-nodes 2 leaves no node"), "{err}");
    let (code, err) = run(&["--allocation", "local:2", "--sample-period", "5ms"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("between 100ms and 1h"), "{err}");
    let (code, err) = run(&["--allocation", "local:2", "--node-memory", "100"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot hold 1 VM(s) of 256 MiB"), "{err}");
}

#[test]
fn monitored_job_without_hog_migrates_nothing() {
    let Some((agent, msgcheck)) = prerequisites() else {
        return;
    };
    let img = image(&agent, &msgcheck);
    let _slot = vm_slot();
    let r = Run::new();
    let mut child = r.launch(&img, 200);
    // While the job runs: nodes, placement and both views of every VM.
    let live = r.wait_running(&mut child);
    let (code, report, err) = finish(child);
    assert_eq!(code, 0, "{err}");
    let nodes: Vec<String> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 4);
    let vms = live["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 3, "{live}");
    for (i, vm) in vms.iter().enumerate() {
        assert_eq!(vm["node"], nodes[i], "rank {i} placement: {live}");
        assert_eq!(vm["mem_max_kib"], 192 * 1024);
    }
    assert_eq!(pool(&live, &nodes[3]), "free", "the spare keeps no VM");
    for i in 0..3 {
        let s = summary(&report, i);
        assert!(
            s.contains("received=200 bad=0") && s.contains("migrated=0"),
            "rank {i}: {s}"
        );
    }
    let monitor = &report["monitor"];
    assert_eq!(monitor["daemon"], true, "{monitor}");
    assert_eq!(monitor["migrations"], Value::Array(vec![]), "{monitor}");
    assert_eq!(monitor["state_db"], r.db.to_string_lossy().as_ref());
    assert!(monitor["rounds"].as_u64().unwrap() >= 4, "{monitor}");
    // After the job: still there, nothing migrated, node views come from the cgroups.
    let after = r.status().expect("vse status after the job");
    assert_eq!(after["migrations"], Value::Array(vec![]));
    for n in &nodes[..3] {
        assert_eq!(pool(&after, n), "allocated");
    }
    let node_samples: Vec<&Value> = after["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "node")
        .collect();
    assert_eq!(node_samples.len(), 4, "{after}");
    for s in node_samples {
        assert_eq!(s["mem"]["total_kib"], NODE_MIB * 1024, "{s}");
    }
    // The hook got JSON lines of both kinds, the Prometheus file the latest samples.
    let hook = std::fs::read_to_string(r.dir.path().join("hook.jsonl")).unwrap();
    let kinds: std::collections::BTreeSet<String> = hook
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].to_string())
        .collect();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    let prom = std::fs::read_to_string(r.dir.path().join("vse.prom")).unwrap();
    assert!(prom.contains("vse_vm_guest_mem_active_bytes{"), "{prom}");
    r.accel_note();
    r.no_qemu_left();
}

#[test]
fn hog_on_a_node_moves_its_vm_to_the_spare_at_a_barrier() {
    let Some((agent, msgcheck)) = prerequisites() else {
        return;
    };
    let img = image(&agent, &msgcheck);
    let _slot = vm_slot();
    let r = Run::new();
    let steps = 600;
    let mut child = r.launch(&img, steps);
    let live = r.wait_running(&mut child);
    let node1 = live["vms"][0]["node"].as_str().unwrap().to_string();
    let (base, _) = monitor::memory_cgroup_base().unwrap();
    let cg = base.join(format!("vse-j{}-{node1}", child.id()));
    assert!(cg.is_dir(), "node cgroup {} missing", cg.display());
    let used = live["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "node" && s["node"] == node1.as_str())
        .map(|s| s["mem"]["active_kib"].as_u64().unwrap() / 1024)
        .unwrap();
    let hog_mib = (NODE_MIB * 88 / 100).saturating_sub(used).max(64);
    eprintln!("{node1}: Active {used} MiB before the hog; hog holds {hog_mib} MiB");
    let _hog = Hog::start(&cg, hog_mib);
    let (code, report, err) = finish(child);
    assert_eq!(code, 0, "{err}");
    let spare = report["nodes"][3].as_str().unwrap().to_string();
    for i in 0..3 {
        let s = summary(&report, i);
        let want = if i == 0 { "migrated=1" } else { "migrated=0" };
        assert!(
            s.contains(&format!("received={steps} bad=0")) && s.contains(want),
            "rank {i}: {s}"
        );
    }
    // The front-end got rank 0's result from the node that runs its VM now.
    assert_eq!(report["ranks"][0]["status"], 0);
    assert_eq!(report["ranks"][0]["node"], 4, "{report}");
    let m = &report["monitor"]["migrations"];
    assert_eq!(m.as_array().map(Vec::len), Some(1), "{m}");
    assert!(m[0].as_str().unwrap().contains("completed"), "{m}");
    // The report carries the move as the journal has it: QEMU's downtime, the steps' times.
    let rec = &report["monitor"]["records"][0];
    assert_eq!(rec["state"], "done", "{report}");
    assert!(rec["moves"][0]["transfer"]["downtime_ms"].is_u64(), "{rec}");
    let steps: Vec<&str> = (rec["events"].as_array().unwrap().iter())
        .filter_map(|e| e["state"].as_str())
        .collect();
    assert_eq!(
        steps,
        [
            "planned",
            "notice_posted",
            "ranks_ready",
            "migrating",
            "done"
        ],
        "{rec}"
    );
    let after = r.status().unwrap();
    let mig = &after["migrations"][0];
    assert_eq!(mig["state"], "done", "{after}");
    assert_eq!(mig["rule"], "failure-avoidance");
    assert_eq!(mig["source"], node1.as_str());
    assert_eq!(mig["moves"][0]["dest"], spare.as_str());
    // Nodes of one machine see the source's probe next to the overlay: the disk stays in
    // place, only the memory moves, and what moved is in the journal.
    let moved = &mig["moves"][0]["transfer"];
    assert_eq!(moved["storage"], "shared", "{after}");
    assert_eq!(moved["disk_bytes"], 0, "{after}");
    assert!(moved["memory_bytes"].as_u64().unwrap() > 0, "{after}");
    assert!(moved["total_ms"].as_u64().unwrap() > 0, "{after}");
    assert_eq!(pool(&after, &node1), "defunct");
    assert_eq!(pool(&after, &spare), "allocated");
    assert_eq!(after["vms"][0]["node"], spare.as_str(), "{after}");
    eprintln!(
        "migration {}: plan to done {} ms (notice, barrier, live migration, hand-over)",
        mig["id"],
        mig["updated_ms"].as_u64().unwrap() - mig["created_ms"].as_u64().unwrap()
    );
    r.accel_note();
    r.no_qemu_left();
}

/// `vse evacuate` against a running job: bad requests are refused with exit 2 and move
/// nothing; the node's VM moves to the spare at a barrier while the job runs, the node ends
/// defunct; a second evacuation finds no spare left and says so with its own exit code.
#[test]
fn evacuate_moves_a_nodes_vm_to_the_spare_and_drains_the_node() {
    let Some((agent, msgcheck)) = prerequisites() else {
        return;
    };
    let img = image(&agent, &msgcheck);
    let _slot = vm_slot();
    let mut r = Run::new();
    let audit = r.with_audit_file();
    let steps = 900;
    let job = format!("ev{}", std::process::id());
    let mut child = r.launch_on(
        &img,
        steps,
        &[
            "--allocation",
            "local:3",
            "--spare-nodes",
            "1",
            "--job",
            &job,
        ],
    );
    let live = r.wait_vms(&mut child, 2);
    let node1 = live["vms"][0]["node"].as_str().unwrap().to_string();
    let node2 = live["vms"][1]["node"].as_str().unwrap().to_string();
    let evacuate = |args: &[&str]| {
        let o = r
            .site_env(&mut Command::new(VSE))
            .arg("evacuate")
            .args(args)
            .arg("--json")
            .env("VSE_RUN_DIR", r.dir.path().join("run"))
            .env_remove("VSE_STATE_DB")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (o.status.code(), doc, err)
    };
    let db = r.db.to_str().unwrap();
    let (code, _, err) = evacuate(&["no-such-node", "--db", db, "--wait"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no running job has a node named no-such-node"),
        "{err}"
    );
    let (code, _, err) = evacuate(&[&node1, "--job", "nosuchjob", "--wait"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no state database"), "{err}");
    let (code, _, err) = evacuate(&[&node1, "--db", db, "--mode", "checkpoint"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, doc, err) = evacuate(&[&node1, "--db", db, "--job", &job, "--wait"]);
    assert_eq!(code, Some(0), "{err}\n{doc}");
    assert_eq!(doc["request"]["state"], "done", "{doc}");
    assert_eq!(doc["request"]["node"], node1.as_str());
    // The spare holds a VM now: nothing is left to take node 2's.
    let (code, doc, err) = evacuate(&[&node2, "--db", db, "--wait"]);
    assert_eq!(code, Some(104), "{err}\n{doc}");
    assert_eq!(doc["request"]["state"], "no_spare", "{doc}");
    assert!(
        doc["request"]["note"]
            .as_str()
            .unwrap()
            .contains("no spare node"),
        "{doc}"
    );
    let (code, report, err) = finish(child);
    assert_eq!(code, 0, "{err}");
    let spare = report["nodes"][2].as_str().unwrap().to_string();
    for i in 0..2 {
        let s = summary(&report, i);
        let want = if i == 0 { "migrated=1" } else { "migrated=0" };
        assert!(
            s.contains(&format!("received={steps} bad=0")) && s.contains(want),
            "rank {i}: {s}"
        );
    }
    let after = r.status().unwrap();
    let mig = &after["migrations"][0];
    assert_eq!(mig["state"], "done", "{after}");
    assert_eq!(mig["rule"], "evacuate");
    assert_eq!(mig["moves"][0]["dest"], spare.as_str());
    assert_eq!(pool(&after, &node1), "defunct");
    assert_eq!(pool(&after, &node2), "allocated");
    assert_eq!(after["vms"][0]["node"], spare.as_str(), "{after}");
    r.no_qemu_left();
    // The audit trail: the launch, each evacuation asked (the one of an unknown node
    // refused), and the move, each written before it happened.
    let o = Command::new(VSE)
        .args(["audit", "--json", "--file"])
        .arg(&audit)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let line = |r: &Value| {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
        format!(
            "{} {} {} {}",
            s("action"),
            s("outcome"),
            s("job"),
            s("detail")
        )
    };
    let got: Vec<String> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(line)
        .collect();
    let img_digest = doc["records"][0]["image"].as_str().unwrap_or("");
    assert!(img_digest.starts_with("sha256:"), "{doc}");
    let want = [
        format!("launch allowed {job} vse launch -- /usr/local/bin/msgcheck {steps} 50"),
        "evacuation refused - node no-such-node (vse evacuate)".to_string(),
        format!("evacuation refused nosuchjob node {node1} (vse evacuate)"),
        format!("evacuation allowed {job} node {node1} (vse evacuate)"),
        format!(
            "migration allowed {job} VM {}: {node1} -> {spare}",
            report["ranks"][0]["vm"].as_str().unwrap_or("?")
        ),
        format!("evacuation allowed {job} node {node2} (vse evacuate)"),
    ];
    assert_eq!(got, want, "{doc}");
    assert!(
        doc["records"][1]["rule"]
            .as_str()
            .unwrap()
            .contains("no running job has a node named no-such-node")
    );
}

/// Speculative oversubscription: two VMs share a node, and when the node's Active memory
/// crosses the threshold one of them moves to the spare (failure avoidance cannot fire with
/// a single allocated node).
const OVERSUBSCRIPTION: &str = "version: 1
name: status-page-test
description: Speculative oversubscription for the status page test
limits:
  vms_per_core: 2
migration:
  active_memory_threshold: 0.99
  oversubscription_threshold: 0.7
  persistence: {k: 2, m: 3}
  cooldown: 5m
  max_concurrent: 1
  barrier:
    deadline: 120s
    action: cancel
";

#[test]
fn status_page_shows_the_nodes_and_the_migration_in_a_browser() {
    let Some((agent, msgcheck)) = prerequisites() else {
        return;
    };
    if !support::browser::chromium() {
        return;
    }
    let img = image(&agent, &msgcheck);
    let _slot = vm_slot();
    let r = Run::with_policy(OVERSUBSCRIPTION);
    let alloc = [
        "--allocation",
        "local:2",
        "--spare-nodes",
        "1",
        "--vms-per-node",
        "2",
    ];
    let mut child = r.launch_on(&img, 1500, &alloc);
    let live = r.wait_vms(&mut child, 2);
    let node = live["vms"][0]["node"].as_str().unwrap().to_string();
    let server = StatusServer::start(&r.db, &["--serve", "127.0.0.1:0"]);
    let url = &server.url;
    // Before the hog: both nodes with their ratios, no migration yet.
    let dom = support::browser::dump_dom(url);
    let ratio = attr(&dom, &format!("data-node=\"{node}\""), "data-ratio")
        .unwrap_or_else(|| panic!("no cell of {node} in {dom}"));
    assert!(
        ratio.parse::<f64>().is_ok_and(|r| (0.0..1.0).contains(&r)),
        "{ratio}"
    );
    assert!(dom.contains("No migrations yet."), "{dom}");
    // The JSON and the Prometheus text of the same state.
    let api = reqwest::blocking::get(format!("{url}api/status"))
        .unwrap()
        .text()
        .unwrap();
    let api: Value = serde_json::from_str(&api).unwrap();
    assert_eq!(api["nodes"].as_array().map(Vec::len), Some(2), "{api}");
    let prom = reqwest::blocking::get(format!("{url}metrics"))
        .unwrap()
        .text()
        .unwrap();
    assert!(prom.contains("vse_node_mem_active_bytes{job="), "{prom}");

    let (base, _) = monitor::memory_cgroup_base().unwrap();
    let cg = base.join(format!("vse-j{}-{node}", child.id()));
    let used = live["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "node" && s["node"] == node.as_str())
        .map(|s| s["mem"]["active_kib"].as_u64().unwrap() / 1024)
        .unwrap();
    let _hog = Hog::start(&cg, (NODE_MIB * 85 / 100).saturating_sub(used).max(64));
    // Live updates: the event stream pushes the migration as the controller records it.
    let events = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
        .get(format!("{url}api/events"))
        .send()
        .unwrap();
    let mut done = None;
    for line in std::io::BufRead::lines(std::io::BufReader::new(events)) {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let doc: Value = serde_json::from_str(data).unwrap();
        if doc["migrations"][0]["state"] == "done" {
            done = Some(doc);
            break;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("vse launch ended with {st} before a migration was done: {doc}");
        }
    }
    let doc = done.expect("the event stream ended before a migration was done");
    let mig = &doc["migrations"][0];
    let (source, dest) = (
        mig["source"].as_str().unwrap(),
        mig["moves"][0]["dest"].as_str().unwrap(),
    );
    assert_eq!(source, node);
    assert_ne!(dest, node);
    // The page as a person would open it now, while the job still runs.
    let running = child.try_wait().unwrap().is_none();
    let dom = support::browser::dump_dom(url);
    let entry = "class=\"migration done\"";
    assert_eq!(
        attr(&dom, entry, "data-source").as_deref(),
        Some(source),
        "{dom}"
    );
    assert_eq!(
        attr(&dom, entry, "data-dest").as_deref(),
        Some(dest),
        "{dom}"
    );
    for n in [source, dest] {
        let r = attr(&dom, &format!("data-node=\"{n}\""), "data-ratio").unwrap_or_default();
        assert!(r.parse::<f64>().is_ok(), "node {n}: ratio {r:?} in {dom}");
    }
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    support::browser::screenshot(url, &shot, 1400, 900);
    eprintln!(
        "status page screenshot: {} (job still running: {running})",
        shot.display()
    );
    let (code, report, err) = finish(child);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        report["monitor"]["migrations"].as_array().map(Vec::len),
        Some(1)
    );
    drop(server);
    r.no_qemu_left();
}
