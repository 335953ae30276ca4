//! The README's user path, all of it as an ordinary account (`vse-tester`: no sudo, not in
//! `kvm`, no group but its own) on the loopback Slurm cluster: `vse check`, `vse lock` and
//! `vse build` (rootless, the same bytes as root's build) of its own spec, `vse launch
//! --allocation slurm` of that image under `salloc` with a spare node (the site's policy in
//! `/etc/vse` allows migrations). On the running job another user's `vse status`,
//! `checkpoint`, `evacuate` and `attach` are refused; root acts as the owner; the owner's
//! `vse status`, `checkpoint` and `vse evacuate` work; its front-end is killed and `vse
//! attach` takes the job over to its end.
//! (`srun --vse=IMAGE|SPEC` as the same account: tests/slurm_spank.rs.)

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::vm::{vm_slot, vm_tools};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_readme_user_path_as_an_ordinary_account() {
    testkit::require!(vm_tools() && testkit::tool("salloc") && testkit::tool("newuidmap"));
    testkit::require!(
        testkit::is_root(),
        "root",
        "the Slurm test cluster of .ci/slurm-up.sh is started as root"
    );
    if !support::host_lists() {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let up = Command::new("sh")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/slurm-up.sh"))
        .output()
        .unwrap();
    assert!(up.status.success(), "slurm-up: {}", text(&up));
    let conf =
        std::env::var("VSE_SLURM_DIR").unwrap_or_else(|_| "/tmp/vse-slurm".into()) + "/slurm.conf";
    let scratch = t.scratch("userpath");
    let dir = scratch.path();
    for f in ["minimal.vse.yaml", "site.policy.yaml"] {
        t.write(
            &dir.join(f),
            std::fs::read(support::specs().join(f)).unwrap(),
        );
    }
    // Where an ordinary user's jobs run by default (no XDG_RUNTIME_DIR here).
    let run = std::path::PathBuf::from(format!("/tmp/vse-run-{}", t.uid));
    let user = |program: &str| {
        let mut c = t.command(program);
        c.current_dir(dir)
            .env("SLURM_CONF", &conf)
            .stdin(Stdio::null());
        c
    };
    let vse = |args: &[&str]| {
        let o = user(VSE).args(args).output().unwrap();
        assert!(o.status.success(), "vse {args:?}: {}", text(&o));
        o
    };
    let spec = ["minimal.vse.yaml", "--policy", "site.policy.yaml"];
    vse(&[&["check"][..], &spec].concat());
    vse(&[&["lock"][..], &spec, &["--allow-expired", "-o", "job.lock"]].concat());
    let start = Instant::now();
    vse(&[
        "build",
        "job.lock",
        "-o",
        "img",
        "--allow-expired",
        "--quiet",
    ]);
    eprintln!("rootless build: {:.1} s", start.elapsed().as_secs_f64());
    // The same bytes as root's build of the same spec, and the user's files.
    let Some(root_img) = support::vm::built_image("minimal.vse.yaml") else {
        return;
    };
    for part in ["root.ext4", "vmlinuz", "initrd.img"] {
        let (a, b) = (root_img.join(part), dir.join("img").join(part));
        let same = Command::new("cmp").arg(&a).arg(&b).status().unwrap();
        assert!(
            same.success(),
            "{} differs from {}",
            b.display(),
            a.display()
        );
        assert_eq!(std::fs::metadata(&b).unwrap().uid(), t.uid, "{part}");
    }

    let _slot = vm_slot();
    let job = format!("user{}", std::process::id());
    let db = run.join(format!("{job}.state.db"));
    let db = db.to_str().unwrap();
    // The allocation outlives the front-end (the shell waits for `released`), so that the
    // job can be taken over once the front-end is killed.
    let script = format!(
        "{VSE} launch img --allocation slurm --spare-nodes 1 --job {job} --checkpoint-dir ck \
         -- sh -c 'until [ -e stop ]; do sleep 0.2; done; echo done' & echo $! > launch.pid; \
         wait; until [ -e released ]; do sleep 0.2; done"
    );
    // The site's policy (in /etc/vse, root's) allows migrations.
    let site = std::fs::read_to_string(support::specs().join("site.policy.yaml")).unwrap();
    let etc = testkit::unpriv::Tester::etc_site(&site, &[]);
    let mut alloc = Ends(
        Some(
            t.command_under_site(etc.path(), "salloc")
                .current_dir(dir)
                .env("SLURM_CONF", &conf)
                .stdin(Stdio::null())
                .args(["-N", "2", "--time=10", "-J", &job, "sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ),
        dir,
    );
    let status = || {
        let o = user(VSE)
            .args(["status", "--json", "--db", db])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_default()
    };
    let until = Instant::now() + Duration::from_secs(300);
    let guest_up = |s: &serde_json::Value| {
        (s["samples"].as_array().into_iter().flatten())
            .any(|x| x["kind"] == "vm" && x["guest"].is_object())
    };
    let before = loop {
        let s = status();
        if guest_up(&s) {
            break s;
        }
        assert!(Instant::now() < until, "the job never reported its VM: {s}");
        assert!(alloc.running(), "salloc ended early");
        std::thread::sleep(Duration::from_millis(300));
    };
    let json = |o: Output| serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap();
    let node = before["vms"][0]["node"].as_str().unwrap().to_string();

    // Another user is refused, whichever way the job is named, and nothing changes.
    let Some(other) = testkit::unpriv::other() else {
        return;
    };
    let attempts: [&[&str]; 5] = [
        &["status", "--db", db],
        &["checkpoint", "--job", &job, "--db", db, "--wait"],
        &["evacuate", &node, "--db", db, "--wait"],
        &["attach", "--job", &job, "--db", db],
        &["checkpoint", "--job", &job],
    ];
    for args in attempts {
        let o = other
            .command(VSE)
            .args(args)
            .env("VSE_RUN_DIR", &run)
            .output()
            .unwrap();
        let err = text(&o);
        assert_eq!(o.status.code(), Some(2), "vse-other: vse {args:?}: {err}");
        assert!(
            err.contains("another user's job") || err.contains("belongs to uid"),
            "vse-other: vse {args:?}: {err}"
        );
    }
    assert_eq!(status()["migrations"], before["migrations"]);
    // Root acts as the owner, with the owner's rights.
    let o = Command::new(VSE)
        .args(["status", "--json", "--db", db])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("acting as vse-tester"), "{}", text(&o));
    // An admin who is not root acts through `sudo vse`; with an admin group named by the
    // site, only its members may (sudo gives root the caller's SUDO_UID; root plays sudo's
    // part here, the accounts having no sudo).
    // The site's audit file is root's, in a directory only root can write.
    let audit_dir = tempfile::tempdir().unwrap();
    let audit = audit_dir.path().join("audit.jsonl");
    std::fs::write(&audit, "").unwrap();
    let as_admin = |group: &str| {
        let site = testkit::unpriv::Tester::etc_site(
            &format!(
                "version: 1\nname: site\nauthority:\n  admin_group: {group}\naudit:\n  file: {}\n",
                audit.display()
            ),
            &[],
        );
        Command::new(VSE)
            .args(["checkpoint", "--job", &job, "--db", db, "--wait", "--json"])
            .env("VSE_SITE_DIR", site.path().join("vse"))
            .env("SUDO_UID", other.uid.to_string())
            .env("SUDO_USER", &other.name)
            .output()
            .unwrap()
    };
    let o = as_admin("vse-tester");
    let err = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("admin group `vse-tester`") && err.contains("10-site.policy.yaml:4:"),
        "{err}"
    );
    let by_admin = as_admin("vse-other");
    let err = text(&by_admin);
    assert_eq!(by_admin.status.code(), Some(0), "{err}");
    assert!(err.contains("acting as vse-tester"), "{err}");
    let o = Command::new(VSE)
        .args(["audit", "--json", "--file"])
        .arg(&audit)
        .output()
        .unwrap();
    let records = json(o)["records"].as_array().cloned().unwrap_or_default();
    let by_other = format!("by vse-other (uid {}) through sudo", other.uid);
    let seen: Vec<(String, String)> = (records.iter())
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("outcome"), s("detail"))
        })
        .collect();
    assert!(
        seen.iter()
            .any(|(o, d)| o == "refused" && d.starts_with(&by_other)),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|(o, d)| o == "allowed"
            && d == &format!(
                "{by_other}, admin group vse-other, as the job's owner vse-tester (uid {})",
                t.uid
            )),
        "{seen:?}"
    );
    // The owner's own checkpoint; the admin's was made as the owner, so it is the owner's.
    let mine = vse(&["checkpoint", "--job", &job, "--db", db, "--wait", "--json"]);
    for ck in [json(by_admin), json(mine)] {
        assert_eq!(ck["request"]["state"], "done", "{ck}");
        let path = ck["request"]["path"].as_str().unwrap();
        assert_eq!(std::fs::metadata(path).unwrap().uid(), t.uid, "{path}");
    }

    let ev = json(vse(&[
        "evacuate", &node, "--job", &job, "--db", db, "--wait", "--json",
    ]));
    assert_eq!(ev["request"]["state"], "done", "{ev}");
    let after = status();
    let now = after["vms"][0]["node"].as_str().unwrap_or_default();
    assert!(
        !now.is_empty() && now != node,
        "the VM is still on {node}: {after}"
    );

    // The front-end dies; the owner takes the job over and gets its output and status.
    let pid = std::fs::read_to_string(dir.join("launch.pid")).unwrap();
    // Its private directory (the barrier socket) dies with it; the next front-end removes it.
    let private = std::env::temp_dir().join(format!("vse-ctl-{job}-{}", pid.trim()));
    assert!(private.is_dir(), "no {}", private.display());
    let kill = user("kill").args(["-KILL", pid.trim()]).status().unwrap();
    assert!(kill.success());
    let attach = user(VSE)
        .args(["attach", "--job", &job, "--db", db])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    t.write(&dir.join("stop"), "");
    let o = attach.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "vse attach: {}", text(&o));
    assert!(text(&o).contains("done"), "{}", text(&o));
    assert!(
        !private.exists(),
        "the killed front-end's {} is left",
        private.display()
    );
    t.write(&dir.join("released"), "");
    let o = alloc.0.take().unwrap().wait_with_output().unwrap();
    assert!(o.status.success(), "salloc: {}", text(&o));
    testkit::process::assert_no_qemu_left(&run, Duration::from_secs(60));
}

/// The allocation, released (and waited for) however the test ends.
struct Ends<'a>(Option<std::process::Child>, &'a Path);

impl Ends<'_> {
    fn running(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for Ends<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            for f in ["stop", "released"] {
                let _ = std::fs::write(self.1.join(f), "");
            }
            let _ = c.wait();
        }
    }
}
