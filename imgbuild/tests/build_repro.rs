//! Reproducibility: the same plan built twice (different directories, fresh rootfs each
//! time) gives byte-identical kernel, initramfs and root disk.

use imgbuild::build::{BuildOptions, build};
use imgbuild::progress::Silent;

#[test]
fn two_builds_of_one_lock_are_byte_identical() {
    let Some(agent) = testkit::fixture::env_file("VSE_GUEST_AGENT", "guest-agent.sh") else {
        return;
    };
    let plan = imgbuild::aptplan::plan_from_apt(
        &[
            imgbuild::aptplan::REQUIRED,
            "busybox-static",
            "linux-image-cloud-amd64",
        ],
        1_747_699_200,
    )
    .expect("apt resolves the minimal set");
    let tmp = tempfile::tempdir().unwrap();
    let mut parts = Vec::new();
    for n in ["a", "b"] {
        let opts = BuildOptions::new(tmp.path().join(n), agent.clone());
        let built = build(&plan, &opts, &Silent).expect("build");
        assert!(!built.cache_hit);
        parts.push(built.manifest.parts);
    }
    for (key, a) in &parts[0] {
        assert_eq!(
            Some(a),
            parts[1].get(key),
            "part {key} differs between two builds"
        );
    }
}
