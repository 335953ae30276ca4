//! One policy stack, judged by `vse check` and by `vse launch`: both take it from vsec's
//! stacking, so they agree. A widening stack is refused by both with exit 2 and the same
//! diagnostics, and `vse launch` refuses it before it starts anything; for a valid stack, the
//! limits `vse check` reports (and where they come from) are the ones `vse launch` enforces.
//! No VM is booted: every launch here ends at a refusal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn vse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vse"))
        .args(args)
        .current_dir(root())
        .env_remove("VSE_STATE_DB")
        .output()
        .expect("run vse")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn policies(stack: &[&str]) -> Vec<String> {
    stack
        .iter()
        .flat_map(|p| ["--policy".to_string(), p.to_string()])
        .collect()
}

/// `vse launch IMAGE` with the stack, on a local allocation, with a state database path that
/// only a started controller would create.
fn launch(image: &Path, stack: &[&str], extra: &[&str], state_db: &Path) -> Output {
    let mut args = vec![
        "launch".to_string(),
        image.display().to_string(),
        "--allocation".into(),
        "local:1".into(),
        "--state-db".into(),
        state_db.display().to_string(),
    ];
    args.extend(policies(stack));
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--".into(), "true".into()]);
    vse(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The diagnostics: everything before the final `error:` line.
fn diagnostics(err: &str) -> &str {
    err.rfind("\nerror: ")
        .map(|i| &err[..=i])
        .unwrap_or_else(|| panic!("no final error line in\n{err}"))
}

const WIDENING: [&str; 2] = [
    "specs/site.policy.yaml",
    "specs/invalid/widening.policy.yaml",
];
const NARROWING: [&str; 2] = ["specs/site.policy.yaml", "specs/partition.policy.yaml"];

#[test]
fn a_widening_stack_is_refused_by_check_and_launch_with_the_same_diagnostics() {
    let tmp = tempfile::tempdir().unwrap();
    let state_db = tmp.path().join("state.db");
    let mut args = vec!["check".to_string(), "specs/minimal.vse.yaml".into()];
    args.extend(policies(&WIDENING));
    let check = vse(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(check.status.code(), Some(2), "{}", stderr(&check));
    let check_err = stderr(&check);
    let want = diagnostics(&check_err);
    let golden = std::fs::read_to_string(root().join("specs/invalid/widening.expected")).unwrap();
    assert_eq!(
        want, golden,
        "vse check's diagnostics of the widening stack"
    );

    // An image directory: its policies are stacked on their own. The refusal comes before
    // the image is even looked at, so none is needed.
    let image = tmp.path().join("no-image");
    let out = launch(&image, &WIDENING, &[], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        diagnostics(&err),
        want,
        "vse launch IMAGE must report what vse check does"
    );
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with("error: policies specs/site.policy.yaml + specs/invalid/widening.policy.yaml: 5 problems found"),
        "{last}"
    );
    assert!(out.stdout.is_empty(), "nothing ran");

    // A spec: merged with the stack, as `vse check` merges it.
    let out = launch(
        Path::new("specs/minimal.vse.yaml"),
        &WIDENING,
        &[],
        &state_db,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        diagnostics(&err),
        want,
        "vse launch SPEC must report what vse check does"
    );
    assert!(
        !state_db.exists(),
        "a refused launch must not have started its controller"
    );
    assert!(!err.contains("agent"), "no agent may have started: {err}");
}

#[test]
fn the_limits_check_reports_are_the_ones_launch_enforces() {
    let tmp = tempfile::tempdir().unwrap();
    let state_db = tmp.path().join("state.db");
    let mut args = vec![
        "check".to_string(),
        "specs/minimal.vse.yaml".into(),
        "--json".into(),
    ];
    args.extend(policies(&NARROWING));
    let check = vse(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    let doc: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let limits = &doc["environment"]["limits"];
    let max_vcpus = limits["max_vcpus"]["value"].as_u64().unwrap();
    let vcpus_at = limits["max_vcpus"]["from"]["at"].as_str().unwrap();
    let max_mib = limits["max_memory"]["value"].as_u64().unwrap() >> 20;
    let memory_at = limits["max_memory"]["from"]["at"].as_str().unwrap();
    assert!(
        vcpus_at.starts_with("specs/partition.policy.yaml:"),
        "{vcpus_at}"
    );

    let image = tmp.path().join("no-image");
    let over = (max_vcpus + 1).to_string();
    let out = launch(&image, &NARROWING, &["--vcpus", &over], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "--vcpus {over}: the policy allows at most {max_vcpus} (policy {vcpus_at})"
        )),
        "{err}"
    );
    let over = (max_mib + 1).to_string();
    let out = launch(&image, &NARROWING, &["--memory", &over], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "--memory {over}: the policy allows at most {max_mib} MiB (policy {memory_at})"
        )),
        "{err}"
    );
    // At the limits the policies agree; the launch goes on to the image, which is missing.
    let (vcpus, mib) = (max_vcpus.to_string(), max_mib.to_string());
    let out = launch(
        &image,
        &NARROWING,
        &["--vcpus", &vcpus, "--memory", &mib],
        &state_db,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no manifest.json"), "{err}");
    assert!(!state_db.exists());
}

#[test]
fn the_allowed_hypervisors_check_reports_are_the_ones_launch_enforces() {
    let tmp = tempfile::tempdir().unwrap();
    let state_db = tmp.path().join("state.db");
    let only_qemu = tmp.path().join("qemu-only.policy.yaml");
    std::fs::write(
        &only_qemu,
        "version: 1\nname: qemu-only\nhypervisors:\n  allowed: [qemu]\n",
    )
    .unwrap();
    let only_qemu = only_qemu.to_str().unwrap();
    let stack = ["specs/site.policy.yaml", only_qemu];
    let mut args = vec![
        "check".to_string(),
        "specs/minimal.vse.yaml".into(),
        "--json".into(),
    ];
    args.extend(policies(&stack));
    let check = vse(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    let doc: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let allowed = &doc["environment"]["hypervisor"]["allowed"];
    assert_eq!(allowed["value"], serde_json::json!(["qemu"]));
    let at = allowed["from"]["at"].as_str().unwrap();

    let image = tmp.path().join("no-image");
    let out = launch(&image, &stack, &["--hypervisor", "libvirt"], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "--hypervisor libvirt: not allowed by the policy (policy {at}: hypervisors.allowed = [qemu])"
        )),
        "{err}"
    );
    let out = launch(&image, &stack, &["--hypervisor", "qemu"], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no manifest.json"), "{err}");
    assert!(!state_db.exists());
}
