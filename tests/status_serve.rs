//! `vse status --serve` without VMs: a state database written through the controller's own
//! API, the real binary serving it, a real HTTP client. Who may connect (loopback, tokens),
//! the JSON, the event stream following a change, the metrics, and the bad-argument exits.
//! The page in a browser during a real migration is in tests/launch_migrate.rs.

mod support;

use control::model::Pool;
use control::state::StateDb;
use monitor::{JobId, MemInfo, NodeName, NodeSample, Sample, VmId};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::status_page::StatusServer;

const VSE: &str = env!("CARGO_BIN_EXE_vse");

fn node(n: &str) -> NodeName {
    NodeName::new(n).unwrap()
}

/// Two nodes, one VM, one sample.
fn state(db: &Path) -> StateDb {
    let mut s = StateDb::open(db).unwrap();
    s.upsert_node(&node("n1"), Pool::Free).unwrap();
    s.upsert_node(&node("n2"), Pool::Free).unwrap();
    let job = JobId::new("j1").unwrap();
    s.add_vm(&job, &VmId::new("j1-r0").unwrap(), &node("n1"), 262_144)
        .unwrap();
    s.record_samples(&[Sample::Node(NodeSample {
        ts_ms: 1_000,
        job: Some(job),
        node: node("n1"),
        mem: MemInfo {
            total_kib: 1_000_000,
            active_kib: 830_000,
            available_kib: 100_000,
        },
        cpu: vec![0.5, 0.25],
    })])
    .unwrap();
    s
}

fn get(url: &str, bearer: Option<&str>) -> (u16, String) {
    let mut req = reqwest::blocking::Client::new().get(url);
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let r = req.send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

#[test]
fn loopback_page_json_metrics_and_live_events() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("state.db");
    let mut s = state(&db);
    let srv = StatusServer::start(&db, &["--serve", "127.0.0.1:0"]);
    let (code, json) = get(&format!("{}api/status", srv.url), None);
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["nodes"][0]["name"], "n1");
    assert_eq!(v["nodes"][0]["pool"], "allocated");
    assert_eq!(v["nodes"][0]["ratio"], 0.83);
    assert_eq!(v["nodes"][0]["vms"][0], "j1-r0");
    assert_eq!(v["pools"]["free"][0], "n2");
    let (code, page) = get(&srv.url, None);
    assert_eq!(code, 200);
    // The page carries the snapshot it renders first.
    assert!(
        page.contains("window.VSE_SNAPSHOT = {\"generated_ms\""),
        "{page}"
    );
    let (code, prom) = get(&format!("{}metrics", srv.url), None);
    assert_eq!(code, 200);
    assert!(
        prom.contains("vse_node_mem_active_bytes{job=\"j1\",node=\"n1\"} 849920000 1000"),
        "{prom}"
    );
    // The event stream: the current state at once, then the change the controller makes.
    let events = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
        .get(format!("{}api/events", srv.url))
        .send()
        .unwrap();
    let mut data = BufReader::new(events)
        .lines()
        .map(Result::unwrap)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .map(|d| serde_json::from_str::<Value>(&d).unwrap());
    assert_eq!(data.next().unwrap()["nodes"][1]["pool"], "free");
    s.upsert_node(&node("n2"), Pool::Defunct).unwrap();
    let next = data.next().unwrap();
    assert_eq!(next["nodes"][1]["pool"], "defunct", "{next}");
    assert_eq!(next["pools"]["defunct"][0], "n2");
}

#[test]
fn a_token_guards_every_request() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("state.db");
    let _s = state(&db);
    let token = tmp.path().join("token");
    std::fs::write(&token, "s3cret-token-of-some-length\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = token.to_str().unwrap();
    let srv = StatusServer::start(&db, &["--serve", "127.0.0.1:0", "--token-file", t]);
    for path in ["", "api/status", "api/events", "metrics"] {
        let url = format!("{}{path}", srv.url);
        assert_eq!(get(&url, None).0, 401, "{url}");
        assert_eq!(
            get(&url, Some("s3cret-token-of-some-lengtX")).0,
            401,
            "{url}"
        );
    }
    let (code, _) = get(
        &format!("{}api/status", srv.url),
        Some("s3cret-token-of-some-length"),
    );
    assert_eq!(code, 200);
    // The page's own URL carries it for the browser (and the page passes it on).
    let (code, page) = get(
        &format!("{}?token=s3cret-token-of-some-length", srv.url),
        None,
    );
    assert_eq!(code, 200);
    assert!(page.contains("VSE_SNAPSHOT"));
}

#[test]
fn bad_serve_arguments_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("state.db");
    let _s = state(&db);
    let run = |args: &[&str]| {
        let o = Command::new(VSE)
            .args(["status", "--db"])
            .arg(&db)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--serve", "0.0.0.0:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs --token-file"), "{err}");
    let (code, err) = run(&["--serve", "nowhere:80"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected IP:PORT or PORT"), "{err}");
    let open = tmp.path().join("open-token");
    std::fs::write(&open, "0123456789abcdef0123\n").unwrap();
    let (code, err) = run(&["--serve", "--token-file", open.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    let o = Command::new(VSE)
        .args(["status", "--serve", "127.0.0.1:0", "--db"])
        .arg(tmp.path().join("missing.db"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
}
