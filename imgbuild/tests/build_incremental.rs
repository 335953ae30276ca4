//! Incremental builds are byte-identical to clean ones: real packages (apt's choice for the
//! minimal set, the host's mirror), real builds. A package added to or removed from a built
//! set, and a changed spec file on an unchanged set, give the kernel, initramfs and root disk
//! of a clean build of the same input; a package with a maintainer script is built clean,
//! and the manifest says why.

use imgbuild::build::{BuildOptions, build};
use imgbuild::customize::{Customization, FileEntry};
use imgbuild::layers::base::RootSource;
use imgbuild::plan::BuildPlan;
use imgbuild::progress::Silent;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vse_image::manifest::Part;

fn agent() -> Option<PathBuf> {
    let agent = std::env::var_os("VSE_GUEST_AGENT").map(PathBuf::from);
    if agent.as_ref().is_some_and(|a| a.exists()) {
        return agent;
    }
    if std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("VSE_GUEST_AGENT is not set (run .ci/guest-agent.sh)");
    }
    eprintln!("skipped: VSE_GUEST_AGENT not set (run .ci/guest-agent.sh)");
    None
}

fn plan(extra: &[&str]) -> BuildPlan {
    let mut pkgs = vec![
        imgbuild::aptplan::REQUIRED,
        "busybox-static",
        "linux-image-cloud-amd64",
    ];
    pkgs.extend(extra);
    imgbuild::aptplan::plan_from_apt(&pkgs, 1_747_699_200).expect("apt resolves the set")
}

struct Built {
    parts: BTreeMap<String, Part>,
    root: RootSource,
    /// `manifest.json` as written.
    manifest: Vec<u8>,
}

/// Builds `plan` with `custom` and the layer store `layers` (`None`: none); keeps only the
/// manifest's figures (images are large).
fn build_with(
    plan: &BuildPlan,
    custom: &Customization,
    layers: Option<&Path>,
    scratch: &Path,
    agent: &Path,
) -> Built {
    let out = scratch.join("image");
    let mut opts = BuildOptions::new(out.clone(), agent.to_path_buf());
    opts.customization = custom.clone();
    opts.layer_cache = layers.map(Path::to_path_buf);
    let b = build(plan, &opts, &Silent).expect("build");
    assert!(!b.cache_hit);
    assert_eq!(
        b.layer_note.is_none(),
        layers.is_some(),
        "{:?}",
        b.layer_note
    );
    let manifest = std::fs::read(out.join(vse_image::MANIFEST)).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    let p = b
        .manifest
        .provenance
        .expect("a new manifest has its provenance");
    assert_eq!(p.packages.len(), plan.packages.len());
    Built {
        parts: b.manifest.parts,
        root: b
            .root
            .expect("a build that was no cache hit says how it got its root"),
        manifest,
    }
}

fn file(content: &str) -> Customization {
    Customization {
        files: vec![FileEntry {
            path: "/etc/vse-incremental-test".into(),
            content: content.as_bytes().to_vec(),
            mode: 0o644,
            uid: 0,
            gid: 0,
        }],
        ..Customization::default()
    }
}

fn same_bytes(a: &Built, b: &Built, what: &str) {
    for key in ["kernel", "initrd", "root"] {
        assert_eq!(
            a.parts.get(key).map(|p| &p.sha256),
            b.parts.get(key).map(|p| &p.sha256),
            "{what}: part {key} differs from the clean build"
        );
    }
    // The manifest too (a signature over it must be reproducible): how the build went is
    // not in it.
    assert_eq!(
        String::from_utf8_lossy(&a.manifest),
        String::from_utf8_lossy(&b.manifest),
        "{what}: manifest.json differs from the clean build's"
    );
}

#[test]
fn incremental_builds_match_clean_builds_byte_for_byte() {
    let Some(agent) = agent() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (cache_a, cache_b) = (tmp.path().join("layers-a"), tmp.path().join("layers-b"));
    let base = plan(&[]);
    let with_tree = plan(&["tree"]);
    let none = Customization::default();
    let b = |p: &BuildPlan, c: &Customization, layers: Option<&Path>| {
        build_with(p, c, layers, tmp.path(), &agent)
    };

    // A clean build saves its configured root as a layer.
    let clean_base = b(&base, &none, Some(&cache_a));
    assert!(
        matches!(clean_base.root, RootSource::Clean { .. }),
        "{:?}",
        clean_base.root
    );

    // One scriptless package added: the layer plus the package, as a clean build would be.
    let delta_add = b(&with_tree, &none, Some(&cache_a));
    match &delta_add.root {
        RootSource::Delta { added, removed, .. } => {
            assert_eq!(
                (added.as_slice(), removed.len()),
                (["tree".to_string()].as_slice(), 0)
            )
        }
        other => panic!("expected a delta build, got {other:?}"),
    }
    let clean_add = b(&with_tree, &none, Some(&cache_b));
    assert!(matches!(clean_add.root, RootSource::Clean { .. }));
    same_bytes(&delta_add, &clean_add, "tree added to a built set");

    // And removed again, from the layer that has it.
    let delta_remove = b(&base, &none, Some(&cache_b));
    match &delta_remove.root {
        RootSource::Delta { added, removed, .. } => {
            assert_eq!(
                (added.len(), removed.as_slice()),
                (0, ["tree".to_string()].as_slice())
            )
        }
        other => panic!("expected a delta build, got {other:?}"),
    }
    same_bytes(&delta_remove, &clean_base, "tree removed from a built set");
    std::fs::remove_dir_all(&cache_b).unwrap();

    // A changed spec file: the layer is reused, only the spec's steps run again.
    let layer_file = b(&base, &file("changed\n"), Some(&cache_a));
    assert!(
        matches!(layer_file.root, RootSource::Layer { .. }),
        "{:?}",
        layer_file.root
    );
    let clean_file = b(&base, &file("changed\n"), None);
    same_bytes(
        &layer_file,
        &clean_file,
        "a changed file on an unchanged set",
    );
    assert_ne!(
        layer_file.parts["root"].sha256, clean_base.parts["root"].sha256,
        "the file is in the image"
    );

    // A package with a maintainer script cannot be added in place: clean, and why.
    let scripted = b(&plan(&["less"]), &none, Some(&cache_a));
    match &scripted.root {
        RootSource::Clean { why } => assert!(why.contains("maintainer script"), "{why}"),
        other => panic!("expected a clean build, got {other:?}"),
    }
}
