//! Helpers of the tests that boot VMs with `vse launch`: the test image and the VM-slot lock.

use std::path::{Path, PathBuf};

/// QEMU and qemu-img are installed (or the test is skipped / fails under VSE_REQUIRE_ALL).
pub fn vm_tools() -> bool {
    testkit::tool("qemu-system-x86_64") && testkit::tool("qemu-img")
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
/// for all tests: under a lock, and `vse build` is a no-op when the image is current (same
/// lock, customization and guest agent: the agent embedded in the `vse` under test).
pub fn built_image(spec: &str) -> Option<PathBuf> {
    if !super::host_lists() {
        return None;
    }
    let shared = std::env::var_os("VSE_CACHE").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&shared).unwrap();
    let stem = spec.trim_end_matches(".vse.yaml");
    let _lock = lock(&shared.join(format!("vse-test-image-{stem}.lock")));
    let img = shared.join(format!("vse-test-image-{stem}"));
    build(&super::specs().join(spec), &img);
    Some(img)
}

/// `vse build SPEC` under the example site policy into `img`, with the agent built into vse.
fn build(spec: &Path, img: &Path) {
    let out = super::vse()
        .arg("build")
        .arg(spec)
        .arg("--policy")
        .arg(super::specs().join("site.policy.yaml"))
        .arg("--allow-expired")
        .arg("-o")
        .arg(img)
        .env_remove("VSE_GUEST_AGENT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build {}: {}",
        spec.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every QEMU started under `run_dir` has exited, waiting up to a minute for teardown.
pub fn no_qemu_left(run_dir: &Path) {
    testkit::process::assert_no_qemu_left(run_dir, std::time::Duration::from_secs(60));
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

/// `spec` (under specs/) plus executables at `/usr/local/bin/<name>`, built once for all tests
/// as image `tag` (a spec copies files only from its own directory, so they are copied next
/// to the derived spec first).
pub fn built_image_with(spec: &str, tag: &str, files: &[(&str, &Path)]) -> Option<PathBuf> {
    if !super::host_lists() {
        return None;
    }
    let shared = std::env::var_os("VSE_CACHE").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = shared.join(format!("vse-test-spec-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _lock = lock(&shared.join(format!("vse-test-image-{tag}.lock")));
    let base = std::fs::read_to_string(super::specs().join(spec)).unwrap();
    let mut text = base.replace("\nname: ", &format!("\nname: {tag}-"));
    text.push_str("files:\n");
    for (name, src) in files {
        let copy = dir.join(name);
        if std::fs::read(&copy).ok() != std::fs::read(src).ok() {
            std::fs::copy(src, &copy).unwrap();
        }
        text.push_str(&format!(
            "  - path: /usr/local/bin/{name}\n    source: {name}\n    mode: \"0755\"\n"
        ));
    }
    let spec_path = dir.join(format!("{tag}.vse.yaml"));
    if std::fs::read_to_string(&spec_path).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&spec_path, &text).unwrap();
    }
    let img = shared.join(format!("vse-test-image-{tag}"));
    build(&spec_path, &img);
    Some(img)
}
