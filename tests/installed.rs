//! The `vse` a user installs is complete. `.ci/run` installs it the conventional way
//! (`cargo install --locked --path .`) and names it in `VSE_INSTALLED`; from an empty working
//! directory, with nothing pointing back into the repository (no `--agent`, no
//! `VSE_GUEST_AGENT`), it builds the minimal spec, runs a command in the image, and launches
//! the spec itself, the second time from the image store.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

fn installed() -> Option<PathBuf> {
    let p = std::env::var_os("VSE_INSTALLED").map(PathBuf::from);
    testkit::require(
        p.as_ref().is_some_and(|p| p.is_file()),
        "VSE_INSTALLED: a `cargo install`ed vse",
        "cargo install --locked --path . --root PREFIX; export VSE_INSTALLED=PREFIX/bin/vse (.ci/run does)",
    )
    .then(|| p.unwrap())
}

fn run(vse: &PathBuf, cwd: &std::path::Path, args: &[&str]) -> Output {
    let out = Command::new(vse)
        .args(args)
        .current_dir(cwd)
        .env_remove("VSE_GUEST_AGENT")
        .env("VSE_RUN_DIR", cwd.join("run"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn installed_vse_builds_runs_and_launches_a_spec_from_an_empty_directory() {
    let Some(vse) = installed() else { return };
    if !support::host_lists() || !support::vm::vm_tools() {
        return;
    }
    let _slot = support::vm::vm_slot();
    let empty = tempfile::tempdir().unwrap();
    let spec = support::specs().join("minimal.vse.yaml");
    let spec = spec.to_str().unwrap();

    run(&vse, empty.path(), &["build", spec, "-o", "img", "--quiet"]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(empty.path().join("img/manifest.json")).unwrap())
            .unwrap();
    let out = run(&vse, empty.path(), &["run", "img", "--", "uname", "-r"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        manifest["kernel_version"].as_str().unwrap(),
        "the guest runs the image's kernel"
    );

    let launch = |marker: &str| {
        let out = run(
            &vse,
            empty.path(),
            &[
                "launch",
                spec,
                "--allocation",
                "local:1",
                "--",
                "sh",
                "-c",
                &format!("echo {marker} $(awk '/^MemTotal/ {{print $2}}' /proc/meminfo)"),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // The spec's `resources.memory: 256MiB` is the VM's (less what the kernel keeps).
        let kib: u64 = (stdout.lines())
            .find_map(|l| l.strip_prefix(&format!("[rank 0] {marker} ")))
            .and_then(|k| k.trim().parse().ok())
            .unwrap_or_else(|| panic!("no marker and memory size: {stdout}"));
        assert!(
            (150 * 1024..=256 * 1024).contains(&kib),
            "{kib} KiB: {stdout}"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    launch("first-launch");
    let again = launch("second-launch");
    assert!(again.contains("unchanged (cache hit)"), "{again}");
    // A finished job leaves no run directory behind (its state database may stay).
    let left: Vec<_> = std::fs::read_dir(empty.path().join("run"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| n.to_string_lossy().contains(".state.db")
                || n.to_string_lossy().starts_with(".kvm-check")),
        "left in the run directory: {left:?}"
    );
}
