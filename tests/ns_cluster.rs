//! `vse launch` on the Slurm cluster of namespace nodes (`.ci/nscluster-up.sh`): each node has
//! its own network namespace and address (10.77.0.I), hostname, node-local image cache and run
//! directory, so the agent tree, staging and the job network cross real addresses and disks.
//! The front-end runs on this machine inside `salloc`, with no `--listen`: it must find its
//! bridge address (10.77.0.254) by itself. Real binary, real Slurm, real TCG VMs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::vm::{built_image, vm_slot, vm_tools};
use testkit::nscluster::NsCluster;
use testkit::process::cmdline;

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// The `-name guest=NAME,…` of a QEMU command line.
fn guest_name(args: &[String]) -> Option<String> {
    let a = args.iter().find_map(|a| a.strip_prefix("guest="))?;
    Some(a.split(',').next().unwrap_or(a).to_string())
}

fn is_qemu(args: &[String]) -> bool {
    args.first().is_some_and(|a| a.contains("qemu-system")) && guest_name(args).is_some()
}

/// A `vse agent` process itself (not the `srun … vse agent …` that started it).
fn is_agent(args: &[String]) -> bool {
    args.get(1).is_some_and(|a| a == "agent") && args.iter().any(|a| a == "--parent")
}

fn arg_after(args: &[String], flag: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone())
}

/// What a sampler saw while the job ran: every VM (by name) and every node agent (by id),
/// with the node whose network namespace it ran in; agents with their `--parent` address.
#[derive(Default, Debug)]
struct Seen {
    vms: BTreeMap<String, BTreeSet<String>>,
    /// Each VM's memory cgroup (cgroup v1), where the host has one.
    vm_cgroups: BTreeMap<String, BTreeSet<String>>,
    agents: BTreeMap<String, (BTreeSet<String>, String)>,
    /// Sockets vse or QEMU listened on in a node's namespace: (node, local address, program).
    listeners: BTreeSet<(String, String, String)>,
}

/// vse's and QEMU's listening TCP and unbound-peer UDP sockets in node `n`'s namespace.
fn listeners(c: &NsCluster, n: u32) -> Vec<(String, String, String)> {
    let Ok(o) = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}{n}", c.prefix))
        .args(["ss", "-H", "-ltunp"])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let prog = f.iter().find_map(|w| w.strip_prefix("users:((\""))?;
            let prog = prog.split('"').next()?.to_string();
            let local = f.get(4)?.to_string();
            (prog == "vse" || prog.starts_with("qemu")).then(|| (format!("n{n}"), local, prog))
        })
        .collect()
}

/// The cgroup v1 memory controller's path of `pid`.
fn memory_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once(':')?;
        Some(rest.strip_prefix("memory:")?.to_string())
    })
}

/// Samples the cluster's QEMU and agent processes until `stop` is set.
fn sampler(c: NsCluster, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let seen = Mutex::new(Seen::default());
        let mut round = 0u32;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            if round.is_multiple_of(5) {
                let l: Vec<_> = (1..=2).flat_map(|n| listeners(&c, n)).collect();
                seen.lock().unwrap().listeners.extend(l);
            }
            for (pid, node) in c.processes_where(|a| is_qemu(a) || is_agent(a)) {
                let Some(args) = cmdline(pid) else { continue };
                let mut s = seen.lock().unwrap();
                if let Some(vm) = guest_name(&args).filter(|_| is_qemu(&args)) {
                    if let Some(cg) = memory_cgroup(pid) {
                        s.vm_cgroups.entry(vm.clone()).or_default().insert(cg);
                    }
                    s.vms.entry(vm).or_default().insert(node);
                } else if let Some(id) = arg_after(&args, "--id") {
                    let parent = arg_after(&args, "--parent").unwrap_or_default();
                    let e = s.agents.entry(id).or_insert((BTreeSet::new(), parent));
                    e.0.insert(node);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        seen.into_inner().unwrap()
    })
}

/// The image cache a node agent of uid 0 uses by default, as the node sees it.
fn default_cache() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/var/tmp/vse-{uid}/images"))
}

/// Two VMs on two namespace nodes (`salloc -N 2`, a chain tree: the front-end starts node 1's
/// agent, which starts node 2's from inside node 1): each QEMU and each agent ran in its own
/// node's network namespace; agent 1's parent is the front-end's bridge address and agent 2's
/// is node 1's; the image was sent to each node's private cache (and not to this machine's);
/// rank 1 reached rank 0 over the job network across the bridge; nothing is left afterwards.
#[test]
fn launch_spans_namespace_nodes_with_private_caches_and_a_job_network() {
    testkit::require!(vm_tools() && testkit::tool("salloc"));
    let Some(cluster) = NsCluster::up() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let tmp = tempfile::tempdir().unwrap();
    let cache = default_cache();
    // Each node's cache starts empty, so staging must send the image to both.
    for n in ["n1", "n2", "n3"] {
        let dir = cluster.node_path(n, cache.parent().unwrap());
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    let host_cache_before = entries(&cache);
    let script = r#"
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
    let stop = Arc::new(AtomicBool::new(false));
    let watch = sampler(cluster.clone(), stop.clone());
    let t0 = Instant::now();
    let o = Command::new("salloc")
        .args(["-N", "2", "--time=10", "--quiet"])
        .arg(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "slurm", "--fanout", "1", "--json"])
        .arg("--policy")
        .arg(support::specs().join("site.policy.yaml"))
        .args(["--", "sh", "-c", script])
        .env("SLURM_CONF", &cluster.conf)
        // Node-local defaults, as on a real cluster: nothing points at a shared directory.
        .env_remove("VSE_IMAGE_CACHE")
        .env_remove("VSE_RUN_DIR")
        .env_remove("VSE_LISTEN")
        .env("VSE_STATE_DB", tmp.path().join("state.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let seen = watch.join().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    eprintln!(
        "--- stdout\n{out}--- stderr\n{err}--- {:?}\n{seen:?}",
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");

    // Each rank on its own node, its VM's QEMU in that node's network namespace.
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{v}");
    let hosts: Vec<&str> = ranks.iter().map(|r| r["host"].as_str().unwrap()).collect();
    assert_eq!(
        hosts.iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"n1", &"n2"]),
        "{v}"
    );
    for r in ranks {
        let (vm, host) = (r["vm"].as_str().unwrap(), r["host"].as_str().unwrap());
        let nodes = seen
            .vms
            .get(vm)
            .unwrap_or_else(|| panic!("{vm} never seen"));
        assert_eq!(nodes, &BTreeSet::from([host.to_string()]), "{vm}");
        // The node's memory is its own, and the job's inside it: its QEMU is in the node
        // agent's job step (Slurm's cgroup), within the node's memory cgroup.
        if Path::new("/sys/fs/cgroup/memory/vse-nscluster").is_dir() {
            let cgs = seen.vm_cgroups.get(vm).cloned().unwrap_or_default();
            let step = format!("/vse-nscluster/{host}/slurm_{host}/uid_0/job_");
            assert!(
                !cgs.is_empty()
                    && cgs
                        .iter()
                        .all(|c| c.starts_with(&step) && c.contains("/step_")),
                "{vm}: {cgs:?}"
            );
        }
    }

    // The agent tree over real addresses: 0 (this machine) -> 1 (n1) -> 2 (n2).
    let a1 = seen.agents.get("1").expect("agent 1 seen");
    let a2 = seen.agents.get("2").expect("agent 2 seen");
    assert_eq!(a1.0, BTreeSet::from(["n1".to_string()]), "{seen:?}");
    assert_eq!(a2.0, BTreeSet::from(["n2".to_string()]), "{seen:?}");
    let front = cluster.frontend.to_string();
    assert!(
        a1.1.starts_with(&format!("{front}:")),
        "agent 1's parent: {a1:?}"
    );
    assert!(a2.1.starts_with("10.77.0.1:"), "agent 2's parent: {a2:?}");

    // Every socket vse or QEMU listened on in a node is on the node's address or loopback.
    assert!(
        seen.listeners.iter().any(|(_, _, p)| p == "vse"),
        "no listener seen: {seen:?}"
    );
    for (node, addr, prog) in &seen.listeners {
        let ip = addr.rsplit_once(':').map_or("", |x| x.0);
        let own = format!("10.77.0.{}", &node[1..]);
        assert!(
            ip == own || ip == "127.0.0.1",
            "{prog} listens on {addr} in {node}"
        );
    }

    // Staged into each node's private cache, sent (not found) on both; none on the spare node
    // or in this machine's own cache.
    let digest = v["staging"]["digest"].as_str().unwrap();
    for n in v["staging"]["nodes"].as_array().unwrap() {
        assert_eq!(n[1]["outcome"], "staged", "{n}");
    }
    for n in ["n1", "n2"] {
        let staged = cluster.node_path(n, &cache.join(digest));
        assert!(
            staged.join("manifest.json").is_file(),
            "{}",
            staged.display()
        );
    }
    assert!(!cluster.node_path("n3", &cache.join(digest)).exists());
    if !host_cache_before.contains(digest) {
        assert!(
            !cache.join(digest).exists(),
            "staged into this machine's cache"
        );
    }

    // Rank 1's line reached rank 0 through both relays and the switch on the bridge address.
    assert!(
        ranks[0]["stdout"]
            .as_str()
            .unwrap()
            .contains("hello-from-1\n"),
        "{v}"
    );
    let net = &v["network"];
    assert!(net["forwarded"].as_u64().unwrap() > 0, "{net}");
    assert_eq!(net["dropped_unknown_source"], 0, "{net}");

    // Nothing of the job is left on any node.
    nothing_left(&cluster);
}

/// `scancel` of a running `vse launch` job of an ordinary user: Slurm ends every process of
/// the job's steps (the node agents, their relays and QEMU are all inside them), and nothing
/// of the job is left on its nodes: no process, no file or directory named for its VMs (run
/// directories, disk overlays), no cgroup.
#[test]
fn scancel_of_a_launch_leaves_nothing_on_its_nodes() {
    testkit::require!(vm_tools() && testkit::tool("salloc") && testkit::tool("scancel"));
    let Some(cluster) = NsCluster::up() else {
        return;
    };
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let scratch = t.scratch("scancel");
    let name = format!("vse-scancel-{}", std::process::id());
    let mut child = t
        .command("salloc")
        .args(["-N", "2", "--time=10", "--quiet", "-J", &name])
        .arg(VSE)
        .arg("launch")
        .arg(&img)
        .args([
            "--allocation",
            "slurm",
            "--job",
            &name,
            "--no-default-shares",
        ])
        .args(["--", "sh", "-c", "echo up; sleep 600"])
        .env("SLURM_CONF", &cluster.conf)
        .env("VSE_STATE_DB", scratch.path().join("state.db"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Both ranks' commands run (their output arrives), so every VM is up.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut ups = 0;
    while ups < 2 {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "the job ended before its ranks ran");
        ups += usize::from(line.trim_end().ends_with("up"));
    }
    let vms: Vec<(String, String)> = cluster
        .processes_where(is_qemu)
        .into_iter()
        .filter_map(|(pid, node)| Some((guest_name(&cmdline(pid)?)?, node)))
        .filter(|(vm, _)| vm.starts_with(&name))
        .collect();
    assert_eq!(vms.len(), 2, "{vms:?}");
    // While the job runs, its VMs' files are where the check below looks.
    for (vm, node) in &vms {
        let mut files = Vec::new();
        for dir in ["/tmp", "/run/vse"] {
            named_under(&cluster.node_path(node, Path::new(dir)), vm, &mut files);
        }
        assert!(
            files.len() >= 2,
            "{vm}'s run directory and overlay on {node}: {files:?}"
        );
    }
    let q = Command::new("squeue")
        .args(["-h", "-n", &name, "-o", "%i"])
        .env("SLURM_CONF", &cluster.conf)
        .output()
        .unwrap();
    let job = String::from_utf8_lossy(&q.stdout).trim().to_string();
    assert!(!job.is_empty(), "job {name} not in squeue");
    let st = t
        .command("scancel")
        .arg(&job)
        .env("SLURM_CONF", &cluster.conf)
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "salloc still running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    nothing_left(&cluster);
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = Vec::new();
        for (_, node) in &vms {
            for dir in ["/tmp", "/run/vse"] {
                named_under(&cluster.node_path(node, Path::new(dir)), &name, &mut left);
            }
            for h in [
                format!("memory/vse-nscluster/{node}/"),
                "freezer/".into(),
                "cpuacct/".into(),
            ] {
                let cg = format!("/sys/fs/cgroup/{h}slurm_{node}/uid_{}/job_{job}", t.uid);
                left.extend(Path::new(&cg).exists().then_some(cg));
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < end, "left after scancel: {left:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every path under `dir` (three levels down) whose name contains `needle`.
fn named_under(dir: &Path, needle: &str, out: &mut Vec<String>) {
    fn walk(dir: &Path, needle: &str, depth: u32, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().contains(needle) {
                out.push(p.display().to_string());
            } else if depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, needle, depth - 1, out);
            }
        }
    }
    walk(dir, needle, 3, out);
}

/// No QEMU or agent of a job is left on any node (within 30 s of its end).
fn nothing_left(cluster: &NsCluster) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let left = cluster.processes_where(|a| is_qemu(a) || is_agent(a));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < end, "left on the nodes: {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The address the front-end picks without `--listen`: this machine's address on the route
/// to a node, the bridge's, never a wildcard; the nodes reach it.
#[test]
fn front_end_address_is_the_route_source_towards_the_nodes() {
    let Some(cluster) = NsCluster::up() else {
        return;
    };
    let node1: std::net::IpAddr = "10.77.0.1".parse().unwrap();
    let got = agents::alloc::source_address_to(node1).unwrap();
    assert_eq!(got, cluster.frontend);
    // From inside node 1 the front-end's address is reachable: a listener there is seen.
    let l = std::net::TcpListener::bind((got, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let ok = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}1", cluster.prefix))
        .args(["bash", "-c", &format!("exec 3<>/dev/tcp/{got}/{port}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "node 1 cannot connect to {got}:{port}");
    assert!(l.accept().is_ok());
}

/// `VSE_LISTEN` names the front-end's address as `--listen` does: a wildcard from it is
/// refused before anything starts (it would listen on every interface of the machine).
#[test]
fn a_wildcard_vse_listen_is_refused() {
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let o = Command::new(VSE)
        .arg("launch")
        .arg(&img)
        .args(["--allocation", "local:1", "--", "true"])
        .env("VSE_LISTEN", "0.0.0.0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("0.0.0.0") && err.contains("wildcard"), "{err}");
}

/// The allocations without Slurm, as an ordinary user: `--allocation hostfile:F` on three
/// nodes, then `--allocation pbs` from a PBS node file on two, each agent started with
/// `ssh NODE` (the nodes' sshd, key authentication, `.ci/nscluster-up.sh`). Each rank ran on
/// its node, whose private cache the user's agent filled; nothing is left afterwards.
#[test]
fn ssh_allocations_start_the_users_agents_on_the_nodes() {
    testkit::require!(vm_tools() && testkit::tool("ssh"));
    let Some(cluster) = NsCluster::up() else {
        return;
    };
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let cache = PathBuf::from(format!("/var/tmp/vse-{}/images", t.uid));
    for n in ["n1", "n2", "n3"] {
        let _ = std::fs::remove_dir_all(cluster.node_path(n, &cache));
    }
    let scratch = t.scratch("sshalloc");
    let hostfile = scratch.path().join("hosts");
    t.write(&hostfile, "# the job's nodes\nn1\nn2\nn3\n");
    let nodefile = scratch.path().join("pbs_nodefile");
    t.write(&nodefile, "n2\nn3\n");
    let launch = |allocation: &str, env: &[(&str, &Path)]| {
        let mut c = t.command(VSE);
        c.args(["launch", img.to_str().unwrap(), "--allocation", allocation])
            .args(["--no-default-shares", "--json", "--"])
            .args(["sh", "-c", "echo rank $VSE_RANK of $VSE_SIZE"])
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{allocation}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["ranks"].as_array().cloned().unwrap_or_default().iter())
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap_or("").trim().to_string();
                (s("host"), r["status"].as_i64(), s("stdout"))
            })
            .collect::<Vec<_>>()
    };
    let hf = format!("hostfile:{}", hostfile.display());
    let ranks = launch(&hf, &[]);
    let want: Vec<_> = (0..3)
        .map(|i| (format!("n{}", i + 1), Some(0), format!("rank {i} of 3")))
        .collect();
    assert_eq!(ranks, want);
    use std::os::unix::fs::MetadataExt;
    for n in ["n1", "n2", "n3"] {
        let dir = cluster.node_path(n, &cache);
        let staged: Vec<_> = entries(&dir)
            .into_iter()
            .filter(|e| !e.starts_with('.'))
            .collect();
        assert_eq!(staged.len(), 1, "{n}: the image, staged: {staged:?}");
        assert_eq!(
            std::fs::metadata(&dir).unwrap().uid(),
            t.uid,
            "{n}: the user's own cache"
        );
    }
    let ranks = launch(
        "pbs",
        &[
            ("PBS_NODEFILE", &nodefile),
            ("PBS_JOBID", Path::new("77.pbs")),
        ],
    );
    let want: Vec<_> = (0..2)
        .map(|i| (format!("n{}", i + 2), Some(0), format!("rank {i} of 2")))
        .collect();
    assert_eq!(ranks, want);
    nothing_left(&cluster);
}
