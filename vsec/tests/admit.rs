//! An image is checked against the policy stack in force when it is launched: the packages
//! and files its manifest records, where it came from, and (when a policy demands it) a
//! signature by a site key over a manifest whose parts still match.

use pgp::composed::{ArmorOptions, KeyType, SecretKeyParamsBuilder};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::Path;
use vse_image::manifest::{Manifest, PackageRef, Part, Provenance, Step};
use vsec::admit::{AdmitError, Admitted, Readers, admit, sign};
use vsec::merge::Stack;
use vsec::yaml::Source;

fn stack(text: &str) -> Stack {
    let src = Source::from_bytes(
        "site.policy.yaml",
        Path::new("site.policy.yaml"),
        text.as_bytes().to_vec(),
    );
    let p = vsec::policy::parse_source(&src).unwrap_or_else(|d| panic!("{d}"));
    let (st, d) = vsec::merge::stack(&[p]);
    assert!(d.is_empty(), "{d}");
    st
}

/// A built image's directory: two small parts and a manifest recording their digests.
fn image(dir: &Path, packages: &[(&str, &str)], steps: &[&str]) {
    let mut parts = BTreeMap::new();
    for (name, file, body) in [("kernel", "vmlinuz", "k"), ("root", "root.ext4", "r")] {
        std::fs::write(dir.join(file), body).unwrap();
        parts.insert(
            name.to_string(),
            Part {
                file: file.into(),
                size: 1,
                sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)),
            },
        );
    }
    let mut m = Manifest::assembled("imgbuild test", "console=ttyS0", parts);
    m.provenance = Some(Provenance {
        layer: String::new(),
        packages: (packages.iter())
            .map(|(n, v)| PackageRef {
                name: n.to_string(),
                version: v.to_string(),
                sha256: String::new(),
            })
            .collect(),
        steps: (steps.iter())
            .map(|s| Step {
                what: s.to_string(),
                sha256: String::new(),
            })
            .collect(),
    });
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
}

fn manifest(dir: &Path) -> Manifest {
    Manifest::read(dir).unwrap()
}

/// A throwaway signing key: (secret key file, public key file).
fn key(dir: &Path, name: &str, seed: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let key = SecretKeyParamsBuilder::default()
        .key_type(KeyType::Ed25519Legacy)
        .can_sign(true)
        .primary_user_id(format!("{name} <{name}@example.org>"))
        .build()
        .unwrap()
        .generate(&mut rng)
        .unwrap()
        .sign(&mut rng, &"".into())
        .unwrap();
    let (sec, public) = (
        dir.join(format!("{name}.key.asc")),
        dir.join(format!("{name}.pub.asc")),
    );
    std::fs::write(
        &sec,
        key.to_armored_string(ArmorOptions::default()).unwrap(),
    )
    .unwrap();
    let pubkey = key.signed_public_key();
    std::fs::write(
        &public,
        pubkey.to_armored_string(ArmorOptions::default()).unwrap(),
    )
    .unwrap();
    (sec, public)
}

#[test]
fn an_image_built_before_a_package_was_forbidden_is_refused() {
    let t = tempfile::tempdir().unwrap();
    image(
        t.path(),
        &[("bash", "5.2.15-2+b7"), ("telnetd", "0.17-44")],
        &[],
    );
    let st = stack("version: 1\nname: site\npackages:\n  forbidden: [\"telnetd\"]\n");
    let e = admit(t.path(), &manifest(t.path()), &st).unwrap_err();
    assert!(matches!(e, AdmitError::Refused { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("site.policy.yaml:4:")
            && msg.contains("holds package `telnetd` 0.17-44, forbidden by `telnetd`"),
        "{msg}"
    );
    // The same image passes a stack that does not forbid it.
    admit(
        t.path(),
        &manifest(t.path()),
        &stack("version: 1\nname: site\n"),
    )
    .unwrap();
}

#[test]
fn files_users_and_required_files_are_checked_again() {
    let t = tempfile::tempdir().unwrap();
    image(
        t.path(),
        &[("bash", "5.2")],
        &["file /etc/munge/munge.key", "user alice uid 1000"],
    );
    let st = stack(
        "version: 1\nname: site\nfiles:\n  protected: [/etc/munge]\n  required:\n    - path: /etc/vse/site.conf\n      content: \"x\\n\"\nusers:\n  uid_range: {min: 20000, max: 59999}\n",
    );
    let msg = admit(t.path(), &manifest(t.path()), &st)
        .unwrap_err()
        .to_string();
    for want in [
        "writes /etc/munge/munge.key, inside the protected path /etc/munge",
        "lacks the file /etc/vse/site.conf the policy requires",
        "user alice with uid 1000, outside users.uid_range 20000-59999",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
}

#[test]
fn images_not_built_by_vse_follow_the_imported_rules() {
    let t = tempfile::tempdir().unwrap();
    image(t.path(), &[], &[]);
    let mut m = manifest(t.path());
    m.provenance = None;
    // Admission reads the manifest itself (once): the one on disk is what counts.
    std::fs::write(
        t.path().join("manifest.json"),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
    let no = stack("version: 1\nname: site\nimages:\n  allow_imported: false\n");
    let msg = admit(t.path(), &m, &no).unwrap_err().to_string();
    assert!(
        msg.contains("not built by vse") && msg.contains("imported images are not allowed"),
        "{msg}"
    );
    admit(t.path(), &m, &stack("version: 1\nname: site\n")).unwrap();
}

#[test]
fn a_required_signature_is_checked_with_the_parts_it_covers() {
    let t = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (site_sec, site_pub) = key(keys.path(), "site", 1);
    let (other_sec, _) = key(keys.path(), "other", 2);
    image(t.path(), &[("bash", "5.2")], &[]);
    let st = stack(&format!(
        "version: 1\nname: site\nimages:\n  signed_by: [{}]\n",
        site_pub.display()
    ));
    let check = || admit(t.path(), &manifest(t.path()), &st);
    assert!(
        matches!(check(), Err(AdmitError::Unsigned { .. })),
        "{:?}",
        check()
    );

    sign(t.path(), &other_sec).unwrap();
    let e = check().unwrap_err();
    assert!(matches!(e, AdmitError::BadSignature { .. }), "{e}");
    assert!(e.to_string().contains("site.policy.yaml:4:"), "{e}");

    sign(t.path(), &site_sec).unwrap();
    check().unwrap();

    // A part changed after signing (same size): its digest no longer matches.
    std::fs::write(t.path().join("root.ext4"), "R").unwrap();
    let e = check().unwrap_err();
    assert!(
        matches!(&e, AdmitError::Tampered { part, .. } if part == "root"),
        "{e}"
    );
    std::fs::write(t.path().join("root.ext4"), "r").unwrap();
    check().unwrap();

    // The manifest changed after signing (a forbidden package hidden, say).
    let text = std::fs::read_to_string(t.path().join("manifest.json")).unwrap();
    std::fs::write(t.path().join("manifest.json"), text.replace("5.2", "5.3")).unwrap();
    assert!(matches!(check(), Err(AdmitError::BadSignature { .. })));
}

#[test]
fn the_copy_is_made_from_the_bytes_admitted() {
    let t = tempfile::tempdir().unwrap();
    image(t.path(), &[("bash", "5.2")], &[]);
    let st = stack("version: 1\nname: site\n");
    let a = Admitted::open(t.path()).unwrap();
    a.check(&st).unwrap();
    // Renamed over after the open: the descriptor still holds the file that was admitted.
    std::fs::write(t.path().join("root.new"), "R").unwrap();
    std::fs::rename(t.path().join("root.new"), t.path().join("root.ext4")).unwrap();
    let store = tempfile::tempdir().unwrap();
    let copy = a.publish(&store.path().join("s"), Readers::Owner).unwrap();
    assert_eq!(
        std::fs::read_to_string(copy.join("root.ext4")).unwrap(),
        "r"
    );
    assert_eq!(copy.file_name().unwrap().to_str().unwrap(), a.digest());
    // A published copy is reused by its manifest's digest.
    let again = Admitted::open(t.path()).unwrap();
    assert_eq!(
        again
            .publish(&store.path().join("s"), Readers::Owner)
            .unwrap(),
        copy
    );
    // Rewritten in place after the open: the copy is refused, nothing is published.
    let b = Admitted::open(t.path()).unwrap();
    let fresh = store.path().join("fresh");
    let e = b.publish(&fresh, Readers::Owner).unwrap_err();
    assert!(
        matches!(&e, AdmitError::Tampered { part, .. } if part == "root"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(&fresh).unwrap().count(),
        0,
        "a refused copy was left"
    );
    // A part that is a symlink is never followed.
    std::fs::remove_file(t.path().join("root.ext4")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", t.path().join("root.ext4")).unwrap();
    let e = Admitted::open(t.path()).unwrap_err();
    assert!(e.to_string().contains("not a regular file inside"), "{e}");
}

#[test]
fn signing_refuses_an_image_whose_parts_do_not_match() {
    let t = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (sec, _) = key(keys.path(), "site", 1);
    image(t.path(), &[("bash", "5.2")], &[]);
    std::fs::write(t.path().join("root.ext4"), "X").unwrap();
    let e = sign(t.path(), &sec).unwrap_err();
    assert!(
        e.to_string().contains("refusing to sign") && e.to_string().contains("`root`"),
        "{e}"
    );
    assert!(!t.path().join("manifest.json.asc").exists());
}

/// The job user swaps `root.ext4` (by rename and by rewriting it in place) and
/// `manifest.json` of its image in a loop while root admits and copies it a thousand times:
/// every copy holds the signed bytes. The same race against admission followed by a read by
/// path (what booted before) does get the other bytes: the attack is real.
#[test]
fn swaps_by_the_image_s_owner_never_reach_the_copy() {
    let Some(tester) = testkit::unpriv::tester() else {
        return;
    };
    let scratch = tester.scratch("admit-race");
    let dir = scratch.path();
    let keys = tempfile::tempdir().unwrap();
    let (site_sec, site_pub) = key(keys.path(), "site", 1);
    let (good, evil) = (vec![b'g'; 256 << 10], vec![b'e'; 256 << 10]);
    let part = |body: &[u8], file: &str| Part {
        file: file.into(),
        size: body.len() as u64,
        sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)),
    };
    let manifest_with = |root: &[u8]| {
        let parts = BTreeMap::from([
            ("kernel".to_string(), part(b"k", "vmlinuz")),
            ("root".to_string(), part(root, "root.ext4")),
        ]);
        serde_json::to_string_pretty(&Manifest::assembled("race", "console=ttyS0", parts)).unwrap()
    };
    for (name, body) in [
        ("vmlinuz", b"k".to_vec()),
        ("root.ext4", good.clone()),
        ("good.bin", good.clone()),
        ("evil.bin", evil.clone()),
        ("manifest.json", manifest_with(&good).into_bytes()),
        ("good.json", manifest_with(&good).into_bytes()),
        ("evil.json", manifest_with(&evil).into_bytes()),
    ] {
        tester.write(&dir.join(name), body);
    }
    sign(dir, &site_sec).unwrap();
    tester.chown(&dir.join("manifest.json.asc"));
    let st = stack(&format!(
        "version: 1\nname: site\nimages:\n  signed_by: [{}]\n",
        site_pub.display()
    ));
    let script = r#"cd "$1"; n=0
while [ ! -e stop ]; do
  cp evil.bin r.tmp && mv -f r.tmp root.ext4
  cp evil.json m.tmp && mv -f m.tmp manifest.json
  cp good.bin r.tmp && mv -f r.tmp root.ext4
  cat evil.bin 1<>root.ext4
  cp good.json m.tmp && mv -f m.tmp manifest.json
  cat good.bin 1<>root.ext4
  n=$((n+1))
done
echo "$n rounds""#;
    let racer = tester
        .command("sh")
        .args(["-c", script, "racer"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let store = tempfile::tempdir().unwrap();
    let (mut copied, mut refused) = (0, 0);
    // A thousand tries, more until both outcomes were seen (a slow racer on a loaded machine).
    for i in 0..20_000 {
        if i >= 1000 && copied > 0 && refused > 0 {
            break;
        }
        let published = Admitted::open(dir).and_then(|a| {
            a.check(&st)?;
            a.publish(&store.path().join(i.to_string()), Readers::Owner)
        });
        match published {
            Ok(copy) => {
                copied += 1;
                assert!(
                    std::fs::read(copy.join("root.ext4")).unwrap() == good,
                    "try {i}: other bytes copied"
                );
                assert_eq!(
                    std::fs::read_to_string(copy.join("manifest.json")).unwrap(),
                    manifest_with(&good),
                    "try {i}"
                );
            }
            Err(_) => refused += 1,
        }
    }
    // The control: admission, then a read by path.
    let mut other_read = false;
    for _ in 0..20_000 {
        if admit(dir, &Manifest::assembled("x", "", BTreeMap::new()), &st).is_ok()
            && std::fs::read(dir.join("root.ext4")).is_ok_and(|b| b != good)
        {
            other_read = true;
            break;
        }
    }
    tester.write(&dir.join("stop"), "");
    let rounds = racer.wait_with_output().unwrap();
    eprintln!(
        "{copied} copied, {refused} refused; racer: {}",
        String::from_utf8_lossy(&rounds.stdout)
    );
    assert!(
        refused > 0,
        "the racer never got in the way: the test proves nothing"
    );
    assert!(copied > 0, "no try admitted the signed image");
    assert!(
        other_read,
        "the control never read swapped bytes after admission"
    );
}

#[test]
fn a_copy_signed_by_another_key_never_stands_in_for_this_one() {
    let t = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (old_sec, _) = key(keys.path(), "old", 3);
    let (site_sec, site_pub) = key(keys.path(), "site", 4);
    image(t.path(), &[("bash", "5.2")], &[]);
    let store = tempfile::tempdir().unwrap();
    let store = store.path().join("s");
    // The same image, published once under an old key (another site, or before a rotation).
    sign(t.path(), &old_sec).unwrap();
    let old = Admitted::open(t.path()).unwrap();
    let old_copy = old.publish(&store, Readers::Owner).unwrap();
    // Signed again by the site's key: its copy is its own, and it is what the site admits.
    sign(t.path(), &site_sec).unwrap();
    let st = stack(&format!(
        "version: 1\nname: site\nimages:\n  signed_by: [{}]\n",
        site_pub.display()
    ));
    let now = Admitted::open(t.path()).unwrap();
    now.check(&st).unwrap();
    let copy = now.publish(&store, Readers::Owner).unwrap();
    assert_ne!(copy, old_copy);
    admit(&copy, &manifest(&copy), &st).unwrap();
    assert!(matches!(
        admit(&old_copy, &manifest(&old_copy), &st),
        Err(AdmitError::BadSignature { .. })
    ));
}
