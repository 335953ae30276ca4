//! `vse status --serve` without VMs: a state database written through the controller's own
//! API, the real binary serving it, a real HTTP client. Who may connect (loopback, tokens),
//! the JSON, the event stream following a change, the metrics, the page held open in headless
//! Chromium following a change (event stream and polling), and the bad-argument exits.
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

/// What the open page shows of node n2 and of its connection: "POOL|LIVE TEXT".
const N2_AND_LIVE: &str = "(document.querySelector('[data-node=\"n2\"]')?.dataset.pool ?? '') \
    + '|' + (document.getElementById('live-text')?.textContent ?? '')";

/// The page as a person keeps it open: a change to the database shows up in the DOM without a
/// reload, through the event stream, and through polling where the browser has no
/// `EventSource`.
#[test]
fn the_open_page_follows_the_database_live() {
    if !support::browser::chromium() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("state.db");
    let mut s = state(&db);
    let srv = StatusServer::start(&db, &["--serve", "127.0.0.1:0"]);
    let cases = [
        (None, "live", Pool::Defunct, "defunct"),
        (
            Some("delete window.EventSource;"),
            "live (polling)",
            Pool::Free,
            "free",
        ),
    ];
    for (before_load, mode, pool, shown) in cases {
        let mut page = support::browser::LivePage::open(&srv.url, before_load);
        let before = page.wait_until(N2_AND_LIVE, 30, |v| {
            v.as_str().is_some_and(|t| t.ends_with(&format!("|{mode}")))
        });
        assert_ne!(before.as_str(), Some(format!("{shown}|{mode}").as_str()));
        s.upsert_node(&node("n2"), pool).unwrap();
        page.wait_until(N2_AND_LIVE, 30, |v| {
            v.as_str() == Some(format!("{shown}|{mode}").as_str())
        });
    }
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
    // A token in the URL is no token: URLs end up in histories, logs and Referer headers.
    let (code, _) = get(
        &format!("{}api/status?token=s3cret-token-of-some-length", srv.url),
        None,
    );
    assert_eq!(code, 401);
    // The page without a token is the sign-in form; signing in sets the page's cookie.
    let (code, login) = get(&srv.url, None);
    assert_eq!(code, 401);
    assert!(
        login.contains("<form method=\"post\" action=\"login\">"),
        "{login}"
    );
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let sign_in = |token: &str| {
        client
            .post(format!("{}login", srv.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
            .send()
            .unwrap()
    };
    assert_eq!(
        sign_in("s3cret-token-of-some-lengtX").status().as_u16(),
        401
    );
    let r = sign_in("s3cret-token-of-some-length");
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("s3cret"),
        "the cookie holds the secret itself: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    for path in ["", "api/status", "metrics"] {
        let r = client
            .get(format!("{}{path}", srv.url))
            .header("cookie", pair)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    // A browser opening a `#token=` link signs in through the page's form and lands on the
    // status page (the fragment never reaches the server or its logs).
    if support::browser::chromium() {
        let dom =
            support::browser::dump_dom(&format!("{}#token=s3cret-token-of-some-length", srv.url));
        assert!(dom.contains("<title>vse status</title>"), "{dom}");
        assert!(
            dom.contains("VSE_SNAPSHOT") && !dom.contains("action=\"login\""),
            "{dom}"
        );
    }
    // A sign-in body past the bound is refused, not read.
    let big = format!("token={}", "x".repeat(64 * 1024));
    assert_eq!(sign_in(&big[6..]).status().as_u16(), 413);
}

/// The attacks of other local accounts: a page that a rebound DNS name points at this
/// server (its `Host` names another site), and another user reading, through a page served
/// on loopback, a state DB only its owner may read.
#[test]
fn other_hosts_and_other_users_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(tester) = testkit::unpriv::tester() else {
        return;
    };
    let Some(other) = testkit::unpriv::other() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = tmp.path().join("state.db");
    let _s = state(&db);
    let curl = |who: &testkit::unpriv::Tester, url: &str, extra: &[&str]| {
        let o = who
            .command("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(extra)
            .arg(url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let srv = StatusServer::start(&db, &["--serve", "127.0.0.1:0"]);
    let url = format!("{}api/status", srv.url);
    assert_eq!(curl(&tester, &url, &[]), "200");
    let port = srv.url.trim_end_matches('/').rsplit(':').next().unwrap();
    let rebound = format!("Host: attacker.example:{port}");
    assert_eq!(curl(&tester, &url, &["-H", &rebound]), "421");
    assert_eq!(
        curl(&tester, &url, &["-H", &format!("Host: localhost:{port}")]),
        "200"
    );
    drop(srv);
    // The tester serving root's DB: without a token, every local user could read through the
    // page what the file's mode may well keep from them.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let serve = |extra: &[&str]| {
        let mut c = tester.command(VSE);
        c.args(["status", "--serve", "127.0.0.1:0", "--db"])
            .arg(&db)
            .args(extra);
        c
    };
    let o = serve(&[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not to you") && err.contains("--token-file"),
        "{err}"
    );
    let scratch = tester.scratch("status-token");
    let token = scratch.path().join("token");
    tester.write(&token, "s3cret-token-of-some-length\n");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut child = serve(&["--token-file", token.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let base = support::status_page::served_url(&mut child);
    let url = format!("{base}api/status");
    let other_sees = curl(&other, &url, &[]);
    let with_token = curl(
        &other,
        &url,
        &["-H", "Authorization: Bearer s3cret-token-of-some-length"],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(other_sees, "401");
    assert_eq!(with_token, "200");
    // A state DB another user planted (theirs, or in a directory they can change) is not read
    // by root: its contents steer what the controller does.
    tester.chown(&db);
    let o = Command::new(VSE)
        .args(["status", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("state database") && err.contains("owned by uid"),
        "{err}"
    );
    // In a directory of the user's, root never opens it: it reads it as the user, with
    // the user's rights only (a link planted there reaches nothing the user cannot read).
    let dir = tester.scratch("status-db");
    let planted = dir.path().join("state.db");
    std::os::unix::fs::symlink("/etc/shadow", &planted).unwrap();
    let o = Command::new(VSE)
        .args(["status", "--db"])
        .arg(&planted)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("acting as vse-tester"), "{err}");
    assert!(!err.contains("root:"), "{err}");
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
