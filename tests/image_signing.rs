//! `images.signed_by` through the CLI: `vse run`, `vse launch` (an image and a spec) and
//! `vse sign`. Every image that is not signed by a key the site trusts today is refused with
//! exit code 2 before anything boots: unsigned, signed by another key, by an expired key, by
//! a revoked key, by a subkey without the signing flag, or changed after signing.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::signing::{Key, Kind, key, tiny_image};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// A site directory whose one policy demands signatures by `keyring`.
fn site_requiring(root: &Path, keyring: &Path) -> (PathBuf, PathBuf) {
    let site = root.join("site");
    std::fs::create_dir_all(site.join("policy.d")).unwrap();
    let policy = site.join("policy.d/sign.policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nname: signing\nimages:\n  signed_by: [{}]\n",
            keyring.display()
        ),
    )
    .unwrap();
    (site, policy)
}

struct Case {
    name: &'static str,
    /// The key the site trusts.
    trusted: &'static str,
    /// The key that signs (None: unsigned).
    signer: Option<&'static str>,
    tamper: bool,
    says: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "unsigned",
        trusted: "site",
        signer: None,
        tamper: false,
        says: "no signature",
    },
    Case {
        name: "another key",
        trusted: "site",
        signer: Some("other"),
        tamper: false,
        says: "its signature is not by a key of",
    },
    Case {
        name: "expired key",
        trusted: "expired",
        signer: Some("expired"),
        tamper: false,
        says: "the key expired on",
    },
    Case {
        name: "revoked key",
        trusted: "revoked",
        signer: Some("revoked"),
        tamper: false,
        says: "the key is revoked",
    },
    Case {
        name: "non-signing subkey",
        trusted: "subkey",
        signer: Some("subkey"),
        tamper: false,
        says: "is not a signing subkey",
    },
    Case {
        name: "tampered part",
        trusted: "site",
        signer: Some("site"),
        tamper: true,
        says: "does not match the signed manifest",
    },
];

fn keys(dir: &Path) -> BTreeMap<&'static str, Key> {
    BTreeMap::from([
        ("site", key(dir, "site", Kind::Good, 1)),
        ("other", key(dir, "other", Kind::Good, 2)),
        ("expired", key(dir, "expired", Kind::Expired, 3)),
        ("revoked", key(dir, "revoked", Kind::Revoked, 4)),
        ("subkey", key(dir, "subkey", Kind::NonSigningSubkey, 5)),
    ])
}

fn output(c: &mut Command) -> (Option<i32>, String) {
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o.status.code(), err)
}

#[test]
fn run_and_launch_refuse_every_image_not_signed_by_a_valid_site_key() {
    if !testkit::require(
        testkit::is_root(),
        "root (VSE_SITE_DIR)",
        "run the tests as root",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let keys = keys(tmp.path());
    for case in CASES {
        let t = tempfile::tempdir().unwrap();
        let img = t.path().join("img");
        std::fs::create_dir(&img).unwrap();
        tiny_image(&img);
        if let Some(s) = case.signer {
            keys[s].sign(VSE, &img);
        }
        if case.tamper {
            std::fs::write(img.join("root.ext4"), vec![b'R'; 4096]).unwrap();
        }
        let (site, policy) = site_requiring(t.path(), &keys[case.trusted].public);
        let env = |c: &mut Command| {
            c.env("VSE_SITE_DIR", &site)
                .env("VSE_CACHE", t.path().join("cache"))
                .env("VSE_RUN_DIR", t.path().join("run"))
                .env("VSE_IMAGE_CACHE", t.path().join("stage"));
        };
        let mut run = Command::new(VSE);
        run.arg("run").arg(&img).args(["--", "true"]);
        env(&mut run);
        let (code, err) = output(&mut run);
        assert_eq!(code, Some(2), "vse run, {}: {err}", case.name);
        assert!(err.contains(case.says), "vse run, {}: {err}", case.name);
        // `vse launch`, with the rule from --policy instead of the site directory.
        let mut launch = Command::new(VSE);
        launch
            .arg("launch")
            .arg(&img)
            .arg("--policy")
            .arg(&policy)
            .args(["--allocation", "local:1", "--", "true"])
            .env("VSE_CACHE", t.path().join("cache"))
            .env("VSE_RUN_DIR", t.path().join("run"))
            .env("VSE_IMAGE_CACHE", t.path().join("stage"));
        let (code, err) = output(&mut launch);
        assert_eq!(code, Some(2), "vse launch, {}: {err}", case.name);
        assert!(err.contains(case.says), "vse launch, {}: {err}", case.name);
    }
    // A spec is built by the user, unsigned: refused before the build, saying why.
    let (_, policy) = site_requiring(tmp.path(), &keys["site"].public);
    let spec = support::specs().join("minimal.vse.yaml");
    let (code, err) = output(
        Command::new(VSE)
            .arg("launch")
            .arg(&spec)
            .arg("--policy")
            .arg(&policy)
            .args(["--allocation", "local:1", "--", "true"]),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("requires signed images") && err.contains("from a spec is unsigned"),
        "{err}"
    );
}

#[test]
fn sign_refuses_an_image_changed_since_it_was_built() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path(), "site", Kind::Good, 1);
    let img = tmp.path().join("img");
    std::fs::create_dir(&img).unwrap();
    tiny_image(&img);
    std::fs::write(img.join("initrd.img"), vec![b'X'; 4096]).unwrap();
    let (code, err) = output(
        Command::new(VSE)
            .arg("sign")
            .arg(&img)
            .arg("--key")
            .arg(&k.secret_file),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("refusing to sign") && err.contains("`initrd`"),
        "{err}"
    );
    assert!(!img.join("manifest.json.asc").exists());
}

/// As the job user: a signed image's root disk and manifest swapped by rename in a loop during
/// `vse launch` (a local allocation, the rule from --policy). What is staged and booted is the
/// private copy admission made from the descriptors it checked: the guest never sees the
/// swapped disk. Once the racer stops, the image boots.
#[test]
fn swapping_a_signed_image_during_launch_never_boots_the_swapped_bytes() {
    use support::signing::{PROBE, RACER, SwapKit, TIMED, chmod, readable_site_key, who};
    use support::vm::{built_image, vm_slot, vm_tools};
    if !vm_tools() {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let (keys, k) = readable_site_key();
    let (_, policy) = site_requiring(keys.path(), &k.public);
    chmod(&keys.path().join("site"), 0o755);
    chmod(&keys.path().join("site/policy.d"), 0o755);
    chmod(&policy, 0o644);
    let scratch = t.scratch("launch-swap");
    let kit = SwapKit::new(&t, &img, scratch.path());
    // `vse launch` of the kit's image under the signing policy, printing what the guest saw.
    let launch_cmd = || {
        let mut c = t.command(VSE);
        c.arg("launch")
            .arg(&kit.img)
            .arg("--policy")
            .arg(&policy)
            .args([
                "--allocation",
                "local:1",
                "--no-network",
                "--",
                "sh",
                "-c",
                PROBE,
            ])
            .env("VSE_RUN_DIR", scratch.path().join("run"))
            .env("VSE_IMAGE_CACHE", scratch.path().join("stage"))
            .stdin(std::process::Stdio::null());
        c
    };
    let launch = || {
        let o = launch_cmd().output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        eprintln!(
            "vse launch -> {:?}\n{out}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.code(), out)
    };
    for n in 0..2 {
        kit.arm(&t, n, &k);
        let racer = t
            .command("sh")
            .args(["-c", RACER, "racer"])
            .arg(&kit.img)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (code, out) = launch();
        t.write(&kit.img.join("stop"), "");
        let rounds = racer.wait_with_output().unwrap();
        eprintln!("racer: {}", String::from_utf8_lossy(&rounds.stdout));
        assert!(!out.contains("SWAPPED"), "try {n} booted the swapped disk");
        assert!(matches!(code, Some(0 | 2)), "try {n}: {code:?}");
        if code == Some(0) {
            assert!(out.contains("[rank 0] clean"), "try {n}: {out}");
        }
    }
    // Timed: the disk is swapped the moment `vse launch` has read it and closed it. What a
    // check-then-use would stage and boot is the swapped disk; the copy is not.
    kit.arm(&t, 2, &k);
    let child = launch_cmd()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let racer = t
        .command("sh")
        .args(["-c", TIMED, "racer"])
        .arg(&kit.img)
        .arg(child.id().to_string())
        .output()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!(
        "timed: {}vse launch -> {:?}\n{out}{}",
        String::from_utf8_lossy(&racer.stdout),
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&racer.stdout), "swapped\n");
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("[rank 0] clean") && !out.contains("SWAPPED"),
        "{out}"
    );
    kit.arm(&t, 3, &k);
    kit.settle();
    let (code, out) = launch();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("[rank 0] clean"), "{out}");
    // The command ran as the job's user, in its home (the launch directory is not the VM's).
    let home = t.home.display();
    assert!(out.contains(&format!("[rank 0] {}\n", who(&t))), "{out}");
    assert!(out.contains(&format!("[rank 0] cwd={home}\n")), "{out}");
}
