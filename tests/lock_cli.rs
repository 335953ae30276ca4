//! `vse lock` end to end with the real binary against the host's real Debian indices
//! (`/var/lib/apt/lists`, kept fresh by `.ci/run`'s `apt-get update`): the lock is apt's
//! choice, deterministic, `--check` notices a changed spec, bad requests exit 2 with a hint.
//!
//! `--allow-expired`: apt accepted these lists when it downloaded them; expiry has its own
//! tests in `vsec/tests/resolve_repo.rs`.

mod support;

use std::path::Path;
use std::process::Output;
use support::{host_lists, specs, vse};
use vsec::lock::{Lockfile, Reason};

fn lock(args: &[&str]) -> Output {
    vse()
        .arg("lock")
        .arg("--allow-expired")
        .arg("--quiet")
        .args(args)
        .output()
        .expect("vse runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn lock_is_apts_choice_deterministic_and_checkable() {
    if !host_lists() {
        return;
    }
    // Arrange: the minimal spec copied next to the lock, so it can be edited later.
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("minimal.vse.yaml");
    std::fs::copy(specs().join("minimal.vse.yaml"), &spec).unwrap();
    let policy = specs().join("site.policy.yaml");
    let out = tmp.path().join("a.lock");
    let s = spec.to_str().unwrap();
    let p = policy.to_str().unwrap();

    // Act: lock twice.
    let o1 = lock(&[s, "--policy", p, "-o", out.to_str().unwrap()]);
    assert!(o1.status.success(), "vse lock: {}", text(&o1.stderr));
    let first = std::fs::read(&out).unwrap();
    let o2 = lock(&[s, "--policy", p, "-o", out.to_str().unwrap()]);
    assert!(o2.status.success(), "{}", text(&o2.stderr));

    // Assert: byte-identical, with the spec's, the policy's and the builder's packages.
    assert_eq!(
        first,
        std::fs::read(&out).unwrap(),
        "same inputs, same lock"
    );
    let l = Lockfile::read(&out).unwrap();
    let reason = |n: &str| {
        l.packages
            .iter()
            .find(|x| x.name.as_str() == n)
            .map(|x| x.reason.clone())
    };
    assert_eq!(reason("busybox-static"), Some(Reason::Requested));
    assert_eq!(reason("linux-image-cloud-amd64"), Some(Reason::Kernel));
    assert_eq!(
        reason("libnuma1"),
        Some(Reason::Policy {
            policy: "site.policy.yaml".into()
        })
    );
    assert_eq!(l.source.spec, Path::new("minimal.vse.yaml"));
    assert!(l.repositories.iter().any(|r| r.suite == "bookworm"));

    // The independent oracle: apt, asked for the same request on an empty system, installs
    // exactly the locked set (the essential variant's base is `Essential: yes`).
    let sandbox = tempfile::tempdir().unwrap();
    let apt = vsec::resolve::apt::AptSandbox {
        dir: sandbox.path().to_path_buf(),
    };
    let mut request: Vec<String> = essential_names();
    request.extend(["busybox-static", "linux-image-cloud-amd64", "libnuma1"].map(String::from));
    let mut apt_set = apt.simulate(&request).expect("apt-get install -s");
    apt_set.sort();
    let mut ours: Vec<String> = l.packages.iter().map(|x| x.name.to_string()).collect();
    ours.sort();
    eprintln!(
        "minimal + site policy: vse {} packages, apt {}",
        ours.len(),
        apt_set.len()
    );
    assert_eq!(ours, apt_set, "vse's lock differs from apt's choice");

    // --check: up to date now (exit 0) ...
    let c = lock(&[s, "--policy", p, "-o", out.to_str().unwrap(), "--check"]);
    assert_eq!(
        c.status.code(),
        Some(0),
        "{}{}",
        text(&c.stdout),
        text(&c.stderr)
    );
    // ... and out of date (exit 3, naming what changed) once the spec asks for more.
    let edited = std::fs::read_to_string(&spec)
        .unwrap()
        .replace("  - busybox-static\n", "  - busybox-static\n  - strace\n");
    std::fs::write(&spec, edited).unwrap();
    let c = lock(&[
        s,
        "--policy",
        p,
        "-o",
        out.to_str().unwrap(),
        "--check",
        "--json",
    ]);
    assert_eq!(c.status.code(), Some(3), "{}", text(&c.stderr));
    let v: serde_json::Value = serde_json::from_slice(&c.stdout).unwrap();
    assert_eq!(v["up_to_date"], false);
    let diffs = v["differences"].to_string();
    assert!(
        diffs.contains("strace") && diffs.contains("environment hash"),
        "{diffs}"
    );
    // --check wrote nothing.
    assert_eq!(first, std::fs::read(&out).unwrap());
}

/// `Essential: yes` packages of the host's bookworm index, as the essential variant uses.
fn essential_names() -> Vec<String> {
    let cfg = {
        let mut c = vsec::resolve::RepoConfig::host(vsec::deb::Arch::new("amd64").unwrap())
            .expect("host sources");
        c.validity = vsec::repo::ValidityCheck::Ignore;
        c
    };
    let (u, _) = vsec::resolve::load_universe(&cfg).expect("host lists load");
    vsec::resolve::base_names(&u, vsec::resolve::BaseVariant::Essential)
        .iter()
        .map(|n| n.to_string())
        .collect()
}

#[test]
fn json_lists_every_package_for_scripts_and_add_resolves_one_off() {
    if !host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.lock");
    let spec = specs().join("minimal.vse.yaml");
    let o = lock(&[
        spec.to_str().unwrap(),
        "--add",
        "strace",
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pkgs = v["packages"].as_array().unwrap();
    let strace = pkgs.iter().find(|p| p["name"] == "strace").expect("strace");
    for key in ["version", "architecture", "filename", "sha256", "size"] {
        assert!(!strace[key].is_null(), "{key} missing: {strace}");
    }
    assert_eq!(strace["sha256"].as_str().unwrap().len(), 64);
    // The spec itself did not change: --add is a one-off.
    assert!(!std::fs::read_to_string(&spec).unwrap().contains("strace"));
    assert_eq!(Lockfile::read(&out).unwrap().packages.len(), pkgs.len());
}

#[test]
fn unknown_forbidden_and_malformed_requests_exit_2_and_write_nothing() {
    if !host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never.lock");
    let spec = specs().join("minimal.vse.yaml");
    let s = spec.to_str().unwrap();
    let o = out.to_str().unwrap();

    // A typo gets a did-you-mean.
    let r = lock(&[s, "--add", "openmpi-bim", "-o", o]);
    assert_eq!(r.status.code(), Some(2));
    let err = text(&r.stderr);
    assert!(
        err.contains("unknown package `openmpi-bim`") && err.contains("openmpi-bin"),
        "{err}"
    );

    // A forbidden package reachable only as a dependency: the error names the chain.
    let pol = tmp.path().join("no-perl.policy.yaml");
    std::fs::write(
        &pol,
        "version: 1\nname: no-perl\npackages:\n  forbidden:\n    - perl-modules-*\n",
    )
    .unwrap();
    let r = lock(&[
        s,
        "--policy",
        pol.to_str().unwrap(),
        "--add",
        "perl",
        "-o",
        o,
    ]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(
        err.contains("perl-modules") && err.contains("perl"),
        "{err}"
    );

    // Grammar errors in --add.
    let r = lock(&[s, "--add", "foo (>> )", "-o", o]);
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r.stderr).contains("--add"), "{}", text(&r.stderr));

    // A policy's repository allow-list holds for the host's apt sources too.
    let pol = tmp.path().join("own-mirror.policy.yaml");
    std::fs::write(
        &pol,
        "version: 1\nname: own-mirror\nrepositories:\n  allowed:\n    - http://mirror.example.org/debian\n",
    )
    .unwrap();
    let r = lock(&[s, "--policy", pol.to_str().unwrap(), "-o", o]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(
        err.contains("is not allowed by policy") && err.contains("own-mirror.policy.yaml:5"),
        "{err}"
    );

    // A suite the host has no apt source for, and no archive named: say what to write.
    let other = tmp.path().join("sid.vse.yaml");
    let minimal = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&other, minimal.replace("suite: bookworm", "suite: sid")).unwrap();
    let r = lock(&[other.to_str().unwrap(), "-o", o]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(
        err.contains("no `sid` suite") && err.contains("base.mirror"),
        "{err}"
    );

    assert!(!out.exists(), "a failed lock must not leave a lockfile");
}

/// Every example on the host's apt sources (no archive or snapshot of its own) locks against
/// the real indices under the stacked example policies, with each requested package in it.
#[test]
fn examples_on_the_host_sources_lock_under_the_example_policies() {
    if !host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut examples: Vec<_> = std::fs::read_dir(specs())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".vse.yaml"))
        .collect();
    examples.sort();
    let (site, partition) = (
        specs().join("site.policy.yaml"),
        specs().join("partition.policy.yaml"),
    );
    let mut locked = Vec::new();
    for spec in &examples {
        let parsed = vsec::spec::load(spec).unwrap_or_else(|e| panic!("{}: {e}", spec.display()));
        let b = &parsed.base;
        if b.mirror.is_some() || b.snapshot.is_some() || b.suite.value.as_str() != "bookworm" {
            continue;
        }
        let name = spec.file_name().unwrap().to_string_lossy().into_owned();
        let out = tmp.path().join(format!("{name}.lock"));
        let o = lock(&[
            spec.to_str().unwrap(),
            "--policy",
            site.to_str().unwrap(),
            "--policy",
            partition.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "vse lock {name}: {}", text(&o.stderr));
        let l = Lockfile::read(&out).unwrap();
        assert!(l.kernel().is_some(), "{name}: no kernel in the lock");
        for want in &parsed.packages {
            let p = l
                .packages
                .iter()
                .find(|p| p.name == want.value.name)
                .unwrap_or_else(|| panic!("{name}: {} not in the lock", want.value));
            assert_eq!(p.reason, Reason::Requested, "{name}: {}", p.name);
            if let Some(c) = &want.value.constraint {
                assert!(c.matches(&p.version), "{name}: {} {}", p.name, p.version);
            }
        }
        locked.push(name);
    }
    eprintln!("locked: {locked:?}");
    assert!(
        locked.iter().any(|n| n == "mpi-analysis.vse.yaml"),
        "the Python/MPI example must be among the locked ones: {locked:?}"
    );
}

/// bookworm's signed InRelease and its `main` amd64 index from the host's lists, as an
/// archive of its own under `root/debian`.
fn bookworm_archive(root: &Path) {
    let lists = Path::new("/var/lib/apt/lists");
    let dists = root.join("debian/dists/bookworm");
    std::fs::create_dir_all(dists.join("main/binary-amd64")).unwrap();
    std::fs::copy(
        lists.join("deb.debian.org_debian_dists_bookworm_InRelease"),
        dists.join("InRelease"),
    )
    .unwrap();
    let lz4 = std::fs::read(
        lists.join("deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4"),
    )
    .unwrap();
    let plain =
        vsec::repo::compress::decompress(&lz4, vsec::repo::compress::Compression::Lz4).unwrap();
    std::fs::write(dists.join("main/binary-amd64/Packages"), plain).unwrap();
}

/// Where `vse lock` reads and what it trusts: the spec's `base.mirror`, `base.components`,
/// `base.architecture` and `base.snapshot`, the policy's `repositories.mirror` and
/// `repositories.keyrings`, and the policy's `defaults.variant` for a spec without one. An
/// archive of its own on loopback (bookworm's signed files from the host's lists).
#[test]
fn archive_fields_choose_where_vse_lock_reads_and_what_it_trusts() {
    if !host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    bookworm_archive(tmp.path());
    let served = testkit::http::ServedDir::start(tmp.path().to_path_buf());
    let mirror = format!("{}/debian", served.url);
    let minimal = std::fs::read_to_string(specs().join("minimal.vse.yaml")).unwrap();
    let file = |name: &str, text: String| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let with_base = |extra: &str| {
        minimal.replace(
            "  variant: essential\n",
            &format!("  variant: essential\n{extra}"),
        )
    };
    let out = tmp.path().join("out.lock");
    let o = out.to_str().unwrap();
    let cache = tmp.path().join("cache");
    let lock_in = |args: &[&str]| {
        vse()
            .args(["lock", "--allow-expired", "--quiet"])
            .args(args)
            .env("VSE_CACHE", &cache)
            .output()
            .expect("vse runs")
    };
    let urls = |path: &Path| -> Vec<String> {
        let l = Lockfile::read(path).unwrap();
        l.repositories.iter().map(|r| r.url.clone()).collect()
    };

    // The spec's mirror, and the policy's: every index from it, and only from it.
    let own = file("own.vse.yaml", with_base(&format!("  mirror: {mirror}\n")));
    let r = lock_in(&[&own, "-o", o]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    assert_eq!(urls(&out), std::slice::from_ref(&mirror));
    let pol = file(
        "mirror.policy.yaml",
        format!("version: 1\nname: mirror\nrepositories:\n  mirror: {mirror}\n"),
    );
    let spec = specs().join("minimal.vse.yaml");
    let spec = spec.to_str().unwrap();
    let r = lock_in(&[spec, "--policy", &pol, "-o", o]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    assert_eq!(urls(&out), std::slice::from_ref(&mirror));
    std::fs::remove_file(&out).unwrap();

    // The policy's keyrings are the only keys that verify it: Debian's removed keys do not.
    let keys = file(
        "keys.policy.yaml",
        format!(
            "version: 1\nname: keys\nrepositories:\n  mirror: {mirror}\n  keyrings: [/usr/share/keyrings/debian-archive-removed-keys.gpg]\n"
        ),
    );
    let r = lock_in(&[spec, "--policy", &keys, "-o", o]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(
        err.contains("BAD SIGNATURE") && err.contains("debian-archive-removed-keys.gpg"),
        "{err}"
    );

    // Components and architecture choose the indices read: this archive has only main, amd64.
    for (name, spec_text, index) in [
        (
            "contrib.vse.yaml",
            with_base(&format!("  mirror: {mirror}\n")).replace("[main]", "[main, contrib]"),
            "/contrib/binary-amd64/Packages",
        ),
        (
            "arm64.vse.yaml",
            with_base(&format!("  mirror: {mirror}\n"))
                .replace("architecture: amd64", "architecture: arm64"),
            "/main/binary-arm64/Packages",
        ),
    ] {
        let s = file(name, spec_text);
        let r = lock_in(&[&s, "-o", o]);
        assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
        let err = text(&r.stderr);
        assert!(
            err.contains(index) && err.contains("not found"),
            "{name}: {err}"
        );
    }

    // A snapshot pins the archive; one whose Release offers none is refused, not ignored.
    let snap = file("snap.vse.yaml", with_base("  snapshot: 20250101T000000Z\n"));
    let r = lock_in(&[&snap, "-o", o]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(
        err.contains("offers no snapshots") && err.contains("20250101T000000Z"),
        "{err}"
    );
    assert!(!out.exists(), "a failed lock must not leave a lockfile");

    // A spec without a variant gets the policy's default: essential's smaller base.
    let bare = file(
        "bare.vse.yaml",
        minimal.replace("  variant: essential\n", ""),
    );
    let count = |args: &[&str]| {
        let r = lock_in(args);
        assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
        Lockfile::read(&out).unwrap().packages.len()
    };
    let variant = file(
        "variant.policy.yaml",
        "version: 1\nname: variant\ndefaults:\n  variant: essential\n".into(),
    );
    let by_default = count(&[&bare, "-o", o]);
    let by_policy = count(&[&bare, "--policy", &variant, "-o", o]);
    assert_eq!(
        by_policy,
        count(&[spec, "-o", o]),
        "the policy's default is the spec's essential"
    );
    assert!(
        by_policy < by_default,
        "{by_policy} packages under essential, {by_default} without"
    );
}
