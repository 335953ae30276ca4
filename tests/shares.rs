//! Host directories in the VM, as an ordinary user (`vse run`, then `vse launch`, whose node
//! agent serves the share): the job starts in its launch directory,
//! reads its input there and writes its results next to it, owned by the user on the host,
//! byte-exact, with what it read on its standard input; a read-only share refuses writes with
//! EROFS; the guest's root writes as the user; and shares the site's policy does not allow
//! are refused before any VM starts.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::vm::{built_image, no_qemu_left, vm_slot, vm_tools};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

fn image() -> Option<PathBuf> {
    match std::env::var_os("VSE_TEST_IMAGE") {
        Some(p) => Some(PathBuf::from(p)),
        None => built_image("minimal.vse.yaml"),
    }
}

fn run(c: &mut Command, img: &Path, dir: &Path, run_dir: &Path, args: &[&str]) -> Output {
    run_with(c, img, dir, run_dir, args, b"")
}

/// `vse run` with `input` on its standard input.
fn run_with(
    c: &mut Command,
    img: &Path,
    dir: &Path,
    run_dir: &Path,
    args: &[&str],
    input: &[u8],
) -> Output {
    use std::io::Write;
    let mut child = c
        .arg("run")
        .arg(img)
        .args(args)
        .current_dir(dir)
        .env("VSE_RUN_DIR", run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A refused run exits without reading: a broken pipe here is its business.
    let feed = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let o = child.wait_with_output().unwrap();
    let _ = feed.join();
    eprintln!(
        "--- vse run {args:?}\n{}{}---",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

#[test]
fn a_job_reads_and_writes_its_directory_as_its_user() {
    if !vm_tools() || !testkit::tool("setpriv") || !testkit::tool("unshare") {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = image() else { return };
    let scratch = t.scratch("shares");
    let dir = scratch.path().join("job");
    let ro = scratch.path().join("refdata");
    for d in [&dir, &ro] {
        std::fs::create_dir(d).unwrap();
        t.chown(d);
    }
    // Binary input larger than one share operation (128 KiB), not a multiple of it.
    let input: Vec<u8> = (0..300_001u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    t.write(&dir.join("input.bin"), &input);
    t.write(&ro.join("table"), "reference\n");
    let run_dir = scratch.path().join("run");
    let script = "pwd; id -u; id -G; echo \"$HOME\"; \
        cat input.bin input.bin > result.bin; mkdir -p out/sub; echo done > out/sub/log; \
        cat /ref/table; echo x > /ref/table || echo refused; echo y > /ref/new || echo refused; \
        cat > from-stdin.txt";
    let _slot = vm_slot();
    let ro_arg = format!("{}:/ref:ro", ro.display());
    let o = run_with(
        &mut t.command(VSE),
        &img,
        &dir,
        &run_dir,
        &["--share", &ro_arg, "--", "sh", "-c", script],
        b"from the host's stdin\n",
    );
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let want = format!(
        "{}\n{}\n{}\n{}\nreference\nrefused\nrefused\n",
        dir.display(),
        t.uid,
        t.gid,
        t.home.display()
    );
    assert_eq!(out, want, "{err}");
    assert_eq!(err.matches("Read-only file system").count(), 2, "{err}");
    let mut twice = input.clone();
    twice.extend_from_slice(&input);
    assert!(
        std::fs::read(dir.join("result.bin")).unwrap() == twice,
        "result.bin differs"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("out/sub/log")).unwrap(),
        "done\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("from-stdin.txt")).unwrap(),
        "from the host's stdin\n"
    );
    for p in [
        "result.bin",
        "out",
        "out/sub",
        "out/sub/log",
        "from-stdin.txt",
    ] {
        assert_eq!(owner(&dir.join(p)), (t.uid, t.gid), "{p}");
    }
    assert_eq!(
        std::fs::read_to_string(ro.join("table")).unwrap(),
        "reference\n"
    );
    assert!(!ro.join("new").exists());

    // `vse launch` too: its node agent serves the launch directory as the user, and the rank
    // starts in it.
    let o = t
        .command(VSE)
        .args([
            "launch",
            img.to_str().unwrap(),
            "--allocation",
            "local:1",
            "--no-stdin",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "pwd; cat out/sub/log; echo rank > launched.txt",
        ])
        .current_dir(&dir)
        .env("VSE_RUN_DIR", &run_dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out, format!("[rank 0] {}\n[rank 0] done\n", dir.display()));
    assert_eq!(owner(&dir.join("launched.txt")), (t.uid, t.gid));

    // The guest's root, where a site grants it, writes into a share as the user.
    let etc = testkit::unpriv::Tester::etc_site(
        "version: 1\nname: site\nusers:\n  allow_root: true\n",
        &[],
    );
    let o = run(
        &mut t.command_under_site(etc.path(), VSE),
        &img,
        &dir,
        &run_dir,
        &[
            "--guest-root",
            "--",
            "sh",
            "-c",
            "id -u; echo r > by-root.txt",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0\n");
    assert_eq!(owner(&dir.join("by-root.txt")), (t.uid, t.gid));
    no_qemu_left(&run_dir);
}

#[test]
fn shares_the_site_does_not_allow_are_refused_before_a_vm_starts() {
    if !testkit::tool("setpriv") || !testkit::tool("unshare") {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let scratch = t.scratch("share-refusals");
    let root = scratch.path();
    let (ok, other) = (root.join("ok"), root.join("other"));
    for d in [&ok, &other, &ok.join("locked")] {
        std::fs::create_dir(d).unwrap();
        t.chown(d);
    }
    std::fs::set_permissions(
        ok.join("locked"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    std::os::unix::fs::symlink(&other, ok.join("escape")).unwrap();
    t.chown(&ok.join("escape"));
    let site = format!(
        "version: 1\nname: site\nshares:\n  allowed:\n    - path: {}\n      mode: rw\n  default: []\n",
        ok.display()
    );
    let etc = testkit::unpriv::Tester::etc_site(&site, &[]);
    // No VM ever starts, so the image need not boot: any directory names one.
    let img = root.join("no-image");
    let run_dir = root.join("run");
    let cases = [
        (other.display().to_string(), "shares.allowed"),
        (ok.join("escape").display().to_string(), "shares.allowed"),
        (format!("{}/../other", ok.display()), "shares.allowed"),
        (
            ok.join("locked").display().to_string(),
            "you cannot read it",
        ),
        (
            ok.join("missing").display().to_string(),
            "no such directory",
        ),
    ];
    for (share, why) in cases {
        let o = run(
            &mut t.command_under_site(etc.path(), VSE),
            &img,
            &ok,
            &run_dir,
            &["--share", &share, "--", "true"],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--share {share}: {err}");
        assert!(
            err.contains(why) && err.contains("--share"),
            "--share {share}: {err}"
        );
        if why == "shares.allowed" {
            assert!(
                err.contains("10-site.policy.yaml:"),
                "names the policy line: {err}"
            );
        }
    }
    assert!(!run_dir.exists(), "no VM was started");
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
}
