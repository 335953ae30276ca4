//! An image is checked against the policy stack in force when it is launched: the packages
//! and files its manifest records, where it came from, and (when a policy demands it) a
//! signature by a site key over a manifest whose parts still match.

use pgp::composed::{ArmorOptions, KeyType, SecretKeyParamsBuilder};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::Path;
use vse_image::manifest::{Manifest, PackageRef, Part, Provenance, RootSource, Step};
use vsec::admit::{AdmitError, admit, sign};
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
        root: RootSource::Clean { why: "test".into() },
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
