//! Helpers of the tests that boot VMs with `vse launch`: the test image, the VM-slot lock and
//! process checks.

use super::require;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `cmd --version` runs.
pub fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// QEMU and qemu-img are installed (or the test is skipped / fails under VSE_REQUIRE_ALL).
pub fn vm_tools() -> bool {
    require(
        "qemu-system-x86_64 and qemu-img",
        have("qemu-system-x86_64") && have("qemu-img"),
    )
}

/// A cross-process lock held until dropped.
pub fn lock(path: &Path) -> std::fs::File {
    let f = std::fs::File::create(path).unwrap();
    f.lock().unwrap();
    f
}

/// Keeps VM tests of several binaries from booting their VMs at the same time (2 cores).
pub fn vm_slot() -> std::fs::File {
    lock(&std::env::temp_dir().join("vse-launch-vms.lock"))
}

/// `spec` (a file under specs/) built with `vse build` into VSE_CACHE (or the temp dir), once
/// for all tests: under a lock, and `vse build` is a no-op when the image is current.
pub fn built_image(spec: &str) -> Option<PathBuf> {
    let agent = std::env::var_os("VSE_GUEST_AGENT").map(PathBuf::from);
    if !require(
        "VSE_GUEST_AGENT (run .ci/guest-agent.sh) to build a test image",
        agent.as_ref().is_some_and(|a| a.exists()),
    ) || !require(
        "bookworm lists in /var/lib/apt/lists (apt-get update)",
        Path::new("/var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease").exists(),
    ) {
        return None;
    }
    let shared = std::env::var_os("VSE_CACHE").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&shared).unwrap();
    let stem = spec.trim_end_matches(".vse.yaml");
    let _lock = lock(&shared.join(format!("vse-test-image-{stem}.lock")));
    let img = shared.join(format!("vse-test-image-{stem}"));
    let out = super::vse()
        .arg("build")
        .arg(super::specs().join(spec))
        .arg("--policy")
        .arg(super::specs().join("site.policy.yaml"))
        .arg("--allow-expired")
        .arg("-o")
        .arg(&img)
        .env("VSE_GUEST_AGENT", agent.unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build {spec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(img)
}

/// Pids of live processes whose command line contains every one of `words`.
pub fn pids_with(words: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z'));
        if !zombie && words.iter().all(|w| args.iter().any(|a| a.contains(w))) {
            out.push(pid);
        }
    }
    out
}

/// Every QEMU started under `run_dir` has exited, waiting up to a minute for teardown.
pub fn no_qemu_left(run_dir: &Path) {
    let needle = run_dir.to_string_lossy().into_owned();
    let t0 = std::time::Instant::now();
    while !pids_with(&["qemu", &needle]).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "QEMU left running: {:?}",
            pids_with(&["qemu", &needle])
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Says which accelerator V2M used (its cache of the KVM check lives in the run directory).
pub fn accel_note(run_dir: &Path) {
    let entries: Vec<String> = std::fs::read_dir(run_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let accel = std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("kvm-check"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect::<Vec<_>>();
    eprintln!(
        "accelerator: {accel:?} (run dir {entries:?}; KVM only if its functional check passed, else TCG)"
    );
}
