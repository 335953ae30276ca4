//! `vse build` + `vse run` end to end with the real binary: a lockfile made from apt's own
//! choice of the minimal set (Debian's required packages, busybox-static, the cloud kernel),
//! built into an image, booted under QEMU, commands run through the guest agent.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::vse;
use vsec::deb::{Arch, DebVersion, PackageName};
use vsec::lock::{LOCK_FORMAT, LockedPackage, LockedRepository, Lockfile, Reason, SourceFiles};

/// apt's plan written as a lockfile: URLs split at `/pool/` into repository + filename.
fn lock_from_apt() -> Lockfile {
    let plan = imgbuild::aptplan::plan_from_apt(
        &[
            imgbuild::aptplan::REQUIRED,
            "busybox-static",
            "linux-image-cloud-amd64",
        ],
        0,
    )
    .expect("apt resolves the minimal set");
    let mut repositories: Vec<LockedRepository> = Vec::new();
    let mut packages = Vec::new();
    for p in &plan.packages {
        let (base, rest) = p.url.split_once("/pool/").expect("pool URL");
        let repository = match repositories.iter().position(|r| r.url == base) {
            Some(i) => i,
            None => {
                repositories.push(LockedRepository {
                    url: base.to_string(),
                    suite: "bookworm".into(),
                    components: vec!["main".into()],
                    release_date: "Sat, 10 May 2025 08:00:00 UTC".into(),
                    release_sha256: "0".repeat(64),
                });
                repositories.len() - 1
            }
        };
        packages.push(LockedPackage {
            name: PackageName::new(&p.name).unwrap(),
            version: DebVersion::parse(&p.version).unwrap(),
            // apt's plan has no architecture: the file name says it (`_all.deb`).
            architecture: Arch::new(if rest.ends_with("_all.deb") {
                "all"
            } else {
                "amd64"
            })
            .unwrap(),
            filename: format!("pool/{}", percent_decoded(rest)),
            size: p.size,
            sha256: p.sha256.clone(),
            repository,
            reason: if p.kernel {
                Reason::Kernel
            } else {
                Reason::Requested
            },
        });
    }
    Lockfile {
        format: LOCK_FORMAT,
        env_hash: "sha256:none".into(),
        generator: "build_cli test (apt plan)".into(),
        architecture: Arch::new("amd64").unwrap(),
        // No spec: `vse build` must say it built packages only.
        source: SourceFiles::default(),
        repositories,
        packages,
    }
}

/// apt's URIs escape `+` and friends (`%2b`); the lock holds the index's file name.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(v) if b[i] == b'%' => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("file names are UTF-8")
}

#[test]
fn build_then_run_uname_and_exit_status() {
    let Some(agent) = vm_image_tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lock_path = tmp.path().join("min.lock");
    lock_from_apt().write(&lock_path).unwrap();
    let img = tmp.path().join("img");

    let out = vse()
        .arg("build")
        .arg(&lock_path)
        .arg("-o")
        .arg(&img)
        .arg("--json")
        .arg("--allow-expired")
        .env("VSE_GUEST_AGENT", &agent)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["customized_from"], serde_json::Value::Null);
    let kver = v["manifest"]["kernel_version"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(kver.ends_with("-cloud-amd64"), "{kver}");
    let lock_bytes = std::fs::read(&lock_path).unwrap();
    let want = imgbuild::from_lock::lock_hash(&lock_bytes);
    assert_eq!(v["manifest"]["lock_hash"], want.as_str());

    let run_dir = tmp.path().join("run");
    let run = |args: &[&str]| run_in(&img, &run_dir, args);
    let (o, err) = run(&["uname", "-r"]);
    assert!(o.status.success(), "vse run uname: {err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), kver);

    // Standard input reaches the command, its end too (`cat` ends); then the status.
    let input: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    let (o, err) = run_with_stdin(
        &img,
        &run_dir,
        &["sh", "-c", "cat; echo to-stderr >&2; exit 7"],
        input.as_bytes(),
    );
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(err.contains("to-stderr"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), input);

    // The image itself is untouched by the runs (they write to an overlay).
    let m = vse_image::Manifest::read(&img).unwrap();
    assert!(m.parts_present(&img));
    let root = m.part_path(&img, "root").unwrap();
    assert_eq!(
        imgbuild::fetch::hash_file(&root).unwrap().1,
        m.parts["root"].sha256
    );
    no_qemu_left(&run_dir);
}

/// Every QEMU started under `run_dir` has exited.
fn no_qemu_left(run_dir: &Path) {
    testkit::process::assert_no_qemu_left(run_dir, std::time::Duration::ZERO);
}

#[test]
fn bad_inputs_exit_2_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.lock");
    std::fs::write(&bad, "format = 1\nenv_hash = 3\n").unwrap();
    let o = vse()
        .arg("build")
        .arg(&bad)
        .args(["--agent", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.lock"), "{err}");

    let o = vse()
        .arg("run")
        .arg(tmp.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("manifest.json"));
}

/// `vse build SPEC` (resolve, then build) + `vse run`, returning the image and its manifest.
fn build_spec(tmp: &Path, spec: &str, agent: &Path) -> (std::path::PathBuf, serde_json::Value) {
    let img = tmp.join("img");
    let out = vse()
        .arg("build")
        .arg(support::specs().join(spec))
        .arg("--policy")
        .arg(support::specs().join("site.policy.yaml"))
        // apt accepted the host's lists when it fetched them; expiry has its own tests.
        .arg("--allow-expired")
        .arg("-o")
        .arg(&img)
        .arg("--json")
        .env("VSE_GUEST_AGENT", agent)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build {spec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(v["customized_from"], serde_json::Value::Null, "{v}");
    assert!(
        tmp.join("img.lock").exists(),
        "the lock is written next to the image"
    );
    (img, v)
}

/// `vse run` with `input` on its standard input.
fn run_with_stdin(
    img: &Path,
    run_dir: &Path,
    args: &[&str],
    input: &[u8],
) -> (std::process::Output, String) {
    use std::io::Write;
    let mut child = vse()
        .arg("run")
        .arg(img)
        .arg("--run-dir")
        .arg(run_dir)
        .arg("--")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, err)
}

fn run_in(img: &Path, run_dir: &Path, args: &[&str]) -> (std::process::Output, String) {
    let (o, err) = run_with_stdin(img, run_dir, args, b"");
    // Which accelerator was used (KVM only after a functional check, else TCG).
    eprintln!(
        "{}",
        err.lines()
            .find(|l| l.contains("accelerator"))
            .unwrap_or(&err)
    );
    (o, err)
}

/// The guest agent (its path), QEMU, qemu-img and mke2fs, or `None` after skip-or-fail.
fn vm_image_tools() -> Option<PathBuf> {
    let agent = testkit::fixture::env_file("VSE_GUEST_AGENT", "guest-agent.sh")?;
    let tools =
        testkit::tool("qemu-system-x86_64") && testkit::tool("qemu-img") && testkit::tool("mke2fs");
    tools.then_some(agent)
}

/// [`vm_image_tools`] and the host's lists, to lock a spec.
fn image_tools() -> Option<PathBuf> {
    vm_image_tools().filter(|_| support::host_lists())
}

#[test]
fn minimal_spec_check_lock_build_run_and_noop_rebuild() {
    let Some(agent) = image_tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (img, v) = build_spec(tmp.path(), "minimal.vse.yaml", &agent);
    let kver = v["manifest"]["kernel_version"]
        .as_str()
        .unwrap()
        .to_string();

    let run_dir = tmp.path().join("run");
    let (o, err) = run_in(&img, &run_dir, &["uname", "-r"]);
    assert!(o.status.success(), "vse run: {err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), kver);
    // The policy's required package is installed in the guest (dpkg's own database says so),
    // and setuid bits of files shipped under merged-/usr aliases (`/bin/su`) survive.
    let (o, err) = run_in(
        &img,
        &run_dir,
        &[
            "sh",
            "-c",
            "dpkg-query -W -f='${Status}\n' libnuma1; stat -c %A /usr/bin/su",
        ],
    );
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "install ok installed\n-rwsr-xr-x\n"
    );
    no_qemu_left(&run_dir);

    // Unchanged spec, policy and repositories: the same lock, and the image is a cache hit.
    let (_, again) = build_spec(tmp.path(), "minimal.vse.yaml", &agent);
    assert_eq!(again["cache_hit"], true, "{again}");
    assert_eq!(again["manifest"]["lock_hash"], v["manifest"]["lock_hash"]);

    // The other output formats, from the lock `vse build SPEC` wrote.
    let lock = tmp.path().join("img.lock");
    let build_format = |format: &str, extra: &[&str]| {
        let dir = tmp.path().join(format!("img-{format}"));
        let o = vse()
            .arg("build")
            .arg(&lock)
            .args(["--format", format, "--json", "-o"])
            .arg(&dir)
            .args(extra)
            .env("VSE_GUEST_AGENT", &agent)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "--format {format}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (dir, report)
    };
    let (q, _) = build_format("qcow2", &[]);
    let m = vse_image::Manifest::read(&q).unwrap();
    let info = Command::new("qemu-img")
        .args(["info", "--output", "json"])
        .arg(m.part_path(&q, "qcow2").expect("a qcow2 part"))
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["virtual-size"].as_u64(), Some(m.parts["root"].size));

    // Without layers every package is unpacked and configured again: the same root disk.
    let (t, report) = build_format("tar", &["--no-layers"]);
    assert_eq!(report["root"]["kind"], "clean", "{report}");
    assert!(
        (report["root"]["why"].as_str()).is_some_and(|w| w.contains("disabled")),
        "{report}"
    );
    let m = vse_image::Manifest::read(&t).unwrap();
    let layered = vse_image::Manifest::read(&q).unwrap();
    assert_eq!(m.parts["root"].sha256, layered.parts["root"].sha256);
    let list = Command::new("tar")
        .args(["--numeric-owner", "-tvzf"])
        .arg(m.part_path(&t, "tar").expect("a tar part"))
        .output()
        .unwrap();
    assert!(list.status.success());
    let list = String::from_utf8_lossy(&list.stdout);
    let line = |suffix: &str| {
        list.lines()
            .find(|l| l.ends_with(suffix))
            .unwrap_or_else(|| panic!("{suffix} not in the tarball"))
            .to_string()
    };
    assert!(
        line("usr/bin/busybox").contains(" 0/0 "),
        "{}",
        line("usr/bin/busybox")
    );
    // setuid and ownership are recorded in the archive, as in the ext4 image.
    assert!(
        line("usr/bin/su").starts_with("-rwsr-xr-x 0/0 "),
        "{}",
        line("usr/bin/su")
    );
}

#[test]
fn mpi_example_builds_and_runs_mpirun() {
    let Some(agent) = image_tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (img, v) = build_spec(tmp.path(), "mpi-lammps.vse.yaml", &agent);
    eprintln!("mpi-lammps: {} packages", v["manifest"]["packages"]);
    let run_dir = tmp.path().join("run");
    let (o, err) = run_in(
        &img,
        &run_dir,
        &["mpirun", "--allow-run-as-root", "--version"],
    );
    assert!(o.status.success(), "mpirun --version: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Open MPI"), "{out}");
    // The science application is there too, linked against the image's own libraries.
    let (o, err) = run_in(
        &img,
        &run_dir,
        &[
            "sh",
            "-c",
            "command -v lmp && ldd $(command -v lmp) | grep -c 'not found' || true",
        ],
    );
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("/usr/bin/lmp"), "{out}");
    assert_eq!(
        out.lines().last().map(str::trim),
        Some("0"),
        "unresolved libraries: {out}"
    );
    no_qemu_left(&run_dir);
}

/// Every account, file and environment field of a spec, read back where it takes effect: the
/// booted guest's own `getent`, `id`, `stat` and the command's environment.
#[test]
fn accounts_files_and_environment_are_in_the_guest_as_the_spec_says() {
    let Some(agent) = image_tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(support::specs().join("minimal.vse.yaml")).unwrap();
    let spec = tmp.path().join("fields.vse.yaml");
    std::fs::write(
        &spec,
        format!(
            r#"{}
groups:
  - name: crew
    gid: 20500
  - name: tools
    gid: 20501
users:
  - name: ada
    uid: 20400
    groups: [crew, tools]
    shell: /bin/bash
    home: /srv/ada
  - name: solo
    uid: 20401
files:
  - path: /srv/data/report.txt
    content: "fields\n"
    owner: ada
    group: tools
    mode: "0640"
environment:
  FIELD_PLAIN: plain
  FIELD_QUOTED: 'say "hi" \ end'
"#,
            base.replace("\nname: minimal", "\nname: fields")
        ),
    )
    .unwrap();
    let (img, _) = build_spec(tmp.path(), spec.to_str().unwrap(), &agent);
    let run_dir = tmp.path().join("run");
    let script = "getent group crew tools solo; getent passwd ada solo; id ada; \
        stat -c '%u %g %a %n' /srv/data/report.txt; stat -c '%u %g %n' /srv/ada; \
        echo \"P=$FIELD_PLAIN\"; echo \"Q=$FIELD_QUOTED\"";
    let (o, err) = run_in(&img, &run_dir, &["sh", "-c", script]);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "crew:x:20500:\n\
         tools:x:20501:ada\n\
         solo:x:20401:\n\
         ada:x:20400:20500::/srv/ada:/bin/bash\n\
         solo:x:20401:20401::/home/solo:/bin/sh\n\
         uid=20400(ada) gid=20500(crew) groups=20500(crew),20501(tools)\n\
         20400 20501 640 /srv/data/report.txt\n\
         20400 20500 /srv/ada\n\
         P=plain\n\
         Q=say \"hi\" \\ end\n"
    );
    no_qemu_left(&run_dir);
}
