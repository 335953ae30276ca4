//! `vse agent` processes across real process boundaries: local children, network namespaces as
//! nodes, and a real Slurm cluster. Agents are SIGKILLed, stopped and cut off mid-job; the
//! front-end must learn which one failed, terminate the rest and leave no process behind.

use serde_json::Value;
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};
use testkit::process::{cmdline, pids_where, wait_gone};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// The front-end process; killed (with everything it started) if a test fails half-way.
struct FrontEnd {
    child: Child,
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl FrontEnd {
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(VSE);
        cmd.arg("agent").arg("--front-end").args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start vse agent");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("front-end: {line}");
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn wait_for(&mut self, event: &str, within: Duration) -> Value {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if v["event"] == event {
                        return v;
                    }
                }
                Err(_) => panic!("no `{event}` event within {within:?}; saw {:?}", self.seen),
            }
        }
    }

    fn wait_exit(&mut self, within: Duration) -> i32 {
        let end = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < end,
                "front-end did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for FrontEnd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Live (non-zombie) `vse agent` processes (id, pid) with an argument matching `pred`.
fn agents_where(pred: impl Fn(&str) -> bool) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = pids_where(|args| {
        // The srun wrapper carries the same argv: keep only the vse process itself.
        args[0].ends_with("vse")
            && args.iter().any(|a| a == "agent")
            && args.iter().any(|a| pred(a))
    })
    .into_iter()
    .filter_map(|pid| {
        let args = cmdline(pid)?;
        let i = args.iter().position(|a| a == "--id")?;
        Some((args.get(i + 1)?.parse().ok()?, pid))
    })
    .collect();
    out.sort();
    out
}

fn signal(pid: u32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

fn assert_no_orphans(pids: &[(u32, u32)]) {
    let pids: Vec<u32> = pids.iter().map(|(_, p)| *p).collect();
    if let Err(left) = wait_gone(&pids, Duration::from_secs(15)) {
        panic!("agents still running after the job ended: {left:?}");
    }
}

/// Starts 7 local agents (binary tree: 1 and 2 interior, 3..7 leaves), hurts one, checks the
/// front-end names it, aborts, exits non-zero, and that no agent process survives.
fn local_fault(victim: u32, sig: &str, reason_has: &[&str]) {
    // The listen port is unique per front-end, so parallel tests can tell their agents apart.
    let mut fe = FrontEnd::start(
        &[
            "--allocation",
            "local:7",
            "--k",
            "2",
            "--heartbeat-ms",
            "200",
            "--timeout-ms",
            "1500",
        ],
        &[],
    );
    let ready = fe.wait_for("ready", Duration::from_secs(30));
    assert_eq!(ready["agents"], 8);
    let agents = all_agents(&fe, 7);
    let pid = agents.iter().find(|(id, _)| *id == victim).unwrap().1;
    signal(pid, sig);
    let failed = fe.wait_for("node_failed", Duration::from_secs(10));
    assert_eq!(failed["node"], victim, "{failed}");
    let reason = failed["reason"].as_str().unwrap();
    assert!(reason_has.iter().any(|r| reason.contains(r)), "{reason}");
    let exit = fe.wait_for("exit", Duration::from_secs(20));
    assert_eq!(exit["exit"]["clean"], false);
    assert_eq!(fe.wait_exit(Duration::from_secs(10)), 1);
    assert_no_orphans(&agents);
}

/// Agents of this front-end: the children find it by the parent address in their argv, and
/// grandchildren by their own parents' addresses; walk the tree by those addresses.
fn all_agents(fe: &FrontEnd, n: usize) -> Vec<(u32, u32)> {
    let end = Instant::now() + Duration::from_secs(10);
    let children_of = |port: u16| {
        let suffix = format!(":{port}");
        agents_where(move |a| a.ends_with(&suffix) && a.contains('.'))
    };
    let fe_port = fe_port(fe);
    loop {
        let mut found = children_of(fe_port);
        let mut more = true;
        while more {
            more = false;
            for (_, pid) in found.clone() {
                for port in listen_ports(pid) {
                    for a in children_of(port) {
                        if !found.contains(&a) {
                            found.push(a);
                            more = true;
                        }
                    }
                }
            }
        }
        found.sort();
        if found.len() >= n {
            return found;
        }
        assert!(
            Instant::now() < end,
            "found agents {found:?} of front-end {}",
            fe.child.id()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// TCP ports a process listens on (from /proc/net/tcp and its socket inodes).
fn listen_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    l.to_string_lossy()
                        .strip_prefix("socket:[")
                        .map(|s| s.trim_end_matches(']').to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // state 0A = LISTEN
            (f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]))
                .then(|| u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect()
}

fn fe_port(fe: &FrontEnd) -> u16 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(p) = listen_ports(fe.child.id()).first() {
            return *p;
        }
        assert!(Instant::now() < end, "front-end listens nowhere");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkill_interior_agent() {
    local_fault(1, "-KILL", &["signal: 9", "connection closed"]);
}

#[test]
fn sigkill_leaf_agent() {
    local_fault(6, "-KILL", &["signal: 9", "connection closed"]);
}

#[test]
fn stopped_agent_is_caught_by_heartbeat() {
    // A stopped process closes nothing: a closed connection means an agent whose heartbeat
    // caught it killed it (its parent does), which may reach the front-end before its own
    // heartbeat does.
    local_fault(7, "-STOP", &["no heartbeat", "connection closed"]);
}

#[test]
fn clean_run_exits_zero_and_leaves_nothing() {
    let mut fe = FrontEnd::start(&["--allocation", "local:5", "--k", "3"], &[]);
    fe.wait_for("ready", Duration::from_secs(30));
    let agents = all_agents(&fe, 5);
    drop(fe.child.stdin.take()); // closing stdin ends the job
    let exit = fe.wait_for("exit", Duration::from_secs(20));
    assert_eq!(exit["exit"]["clean"], true);
    assert_eq!(fe.wait_exit(Duration::from_secs(10)), 0);
    assert_no_orphans(&agents);
}

fn ci_script(name: &str) -> String {
    format!("{}/.ci/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Network namespaces as nodes: one agent per namespace, the front-end on the bridge. Cutting
/// one namespace's link must be caught by the heartbeat within the timeout.
#[test]
fn netns_nodes_and_a_cut_link() {
    testkit::require!(testkit::tool("ip"));
    testkit::require!(
        testkit::is_root(),
        "root",
        "network namespaces as nodes need root"
    );
    let prefix = format!("vl{}", std::process::id() % 10000);
    let net = format!("10.78.{}", std::process::id() % 250);
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = Command::new("sh")
                .args([&ci_script("netns-down.sh"), &self.0, "4"])
                .status();
        }
    }
    let st = Command::new("sh")
        .args([&ci_script("netns-up.sh"), &prefix, "4", &net])
        .status()
        .unwrap();
    assert!(st.success(), "netns-up failed");
    let _down = Down(prefix.clone());
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts");
    let lines: String = (1..=4)
        .map(|i| format!("{prefix}{i} addr={net}.{i}\n"))
        .collect();
    std::fs::write(&hostfile, lines).unwrap();
    let mut fe = FrontEnd::start(
        &[
            "--allocation",
            &format!("hostfile:{}", hostfile.display()),
            "--remote",
            "wrap:ip netns exec {host}",
            "--listen",
            &format!("{net}.254"),
            "--k",
            "2",
            "--heartbeat-ms",
            "200",
            "--timeout-ms",
            "1500",
        ],
        &[],
    );
    let ready = fe.wait_for("ready", Duration::from_secs(30));
    assert_eq!(ready["agents"], 5);
    let marker = format!("@{net}.");
    let agents = agents_where(|a| a.contains(&marker));
    assert_eq!(agents.len(), 4, "{agents:?}");
    let st = Command::new("ip")
        .args(["link", "set", &format!("{prefix}v3"), "down"])
        .status()
        .unwrap();
    assert!(st.success());
    let failed = fe.wait_for("node_failed", Duration::from_secs(10));
    assert_eq!(failed["node"], 3, "{failed}");
    assert!(
        failed["reason"].as_str().unwrap().contains("no heartbeat"),
        "{failed}"
    );
    let exit = fe.wait_for("exit", Duration::from_secs(20));
    assert_eq!(exit["exit"]["clean"], false);
    assert_eq!(fe.wait_exit(Duration::from_secs(10)), 1);
    assert_no_orphans(&agents);
}

/// A real Slurm allocation of 3 nodes: agents started with `srun --overlap`, one per node.
#[test]
fn slurm_allocation_of_three_nodes() {
    testkit::require!(testkit::tool("salloc"));
    testkit::require!(
        testkit::is_root(),
        "root",
        "the Slurm test cluster of .ci/slurm-up.sh is started as root"
    );
    let out = Command::new("sh")
        .arg(ci_script("slurm-up.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "slurm-up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conf = "/tmp/vse-slurm/slurm.conf";
    let conf = std::env::var("VSE_SLURM_DIR")
        .map(|d| format!("{d}/slurm.conf"))
        .unwrap_or(conf.into());
    // salloc runs the front-end with stdin at EOF: bootstrap, overlay, then a clean shutdown.
    let out = Command::new("salloc")
        .args([
            "-N",
            "3",
            "--time=2",
            VSE,
            "agent",
            "--front-end",
            "--allocation",
            "slurm",
            "--k",
            "2",
        ])
        .env("SLURM_CONF", &conf)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ready = events
        .iter()
        .find(|e| e["event"] == "ready")
        .expect("ready event");
    assert_eq!(ready["agents"], 4);
    let exit = events
        .iter()
        .find(|e| e["event"] == "exit")
        .expect("exit event");
    assert_eq!(exit["exit"]["clean"], true);
    assert!(out.status.success());
}
