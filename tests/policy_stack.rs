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
        last.starts_with("error: policies specs/site.policy.yaml + specs/invalid/widening.policy.yaml: 6 problems found"),
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

    // How long a job's VMs may outlive a lost launch: a longer --attach-grace is refused,
    // naming the policy's line, before anything starts.
    let grace = tmp.path().join("grace.policy.yaml");
    std::fs::write(
        &grace,
        "version: 1\nname: grace\ncheckpoint:\n  attach_grace: 30s\n",
    )
    .unwrap();
    let stack = ["specs/site.policy.yaml", grace.to_str().unwrap()];
    let out = launch(&image, &stack, &["--attach-grace", "31"], &state_db);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--attach-grace 31: the policies allow at most 30 s (policy ")
            && err.contains("grace.policy.yaml:4:")
            && err.contains("checkpoint.attach_grace"),
        "{err}"
    );
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

/// `vse ARGS` as the ordinary account `t`, in a private mount namespace whose /etc/vse is
/// `vse ARGS` as the account, under the site tree `root` (see `Tester::command_under_site`).
fn vse_as(t: &testkit::unpriv::Tester, root: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    t.command_under_site(root, env!("CARGO_BIN_EXE_vse"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run vse as the test account")
}

fn all_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One stack — the site directory, the job's partition policy and the user's `--policy` —
/// judged by `vse check`, `vse launch`, `vse run` and the check `srun --vse` runs (`vse spank
/// check`, the SPANK plugin's srun-side phase, with the same arguments), all as the ordinary
/// account: each refuses the same requests, naming the same policy line. Every case is refused
/// before anything boots.
#[test]
fn one_stack_gives_the_same_verdicts_on_every_path() {
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    if !testkit::tool("setpriv") || !testkit::tool("unshare") {
        return;
    }
    let etc = testkit::unpriv::Tester::etc_site(
        "version: 1\nname: site\nlimits:\n  max_vcpus: 8\nhypervisors:\n  allowed: [qemu, libvirt]\n",
        &[
            (
                "small",
                "version: 1\nname: small\nlimits:\n  max_vcpus: 2\n",
            ),
            (
                "vmware",
                "version: 1\nname: vmware\nhypervisors:\n  allowed: [libvirt]\n",
            ),
        ],
    );
    let home = t.scratch("stack");
    let d = home.path();
    let spec_text = |extra: &str| {
        format!("version: 1\nname: t\nbase:\n  distribution: debian\n  suite: bookworm\n{extra}")
    };
    let spec4 = d.join("four.vse.yaml");
    t.write(&spec4, spec_text("resources:\n  vcpus: 4\n"));
    let specq = d.join("qemu.vse.yaml");
    t.write(&specq, spec_text("hypervisor: qemu\n"));
    // No hypervisor asked for: the node boots it under QEMU all the same.
    let plain = d.join("plain.vse.yaml");
    t.write(&plain, spec_text(""));
    let widen = d.join("widen.policy.yaml");
    t.write(&widen, "version: 1\nname: mine\nlimits:\n  max_vcpus: 64\n");
    let (spec4, specq, plain, widen) = (
        spec4.to_str().unwrap(),
        specq.to_str().unwrap(),
        plain.to_str().unwrap(),
        widen.to_str().unwrap(),
    );
    let state_db = d.join("state.db");
    let state_db = state_db.to_str().unwrap();
    let image = d.join("no-image");
    let image = image.to_str().unwrap();
    fn launch_args<'a>(image: &'a str, db: &'a str, more: [&'a str; 2]) -> Vec<&'a str> {
        let mut v = vec!["launch", image, "--allocation", "local:1", "--state-db", db];
        v.extend_from_slice(&more);
        v.extend_from_slice(&["--", "true"]);
        v
    }
    let launch = |more| launch_args(image, state_db, more);
    let small_at = "/etc/vse/partition.d/small.policy.yaml:4:14";
    let vmware_at = "/etc/vse/partition.d/vmware.policy.yaml:4:12";
    let site_at = "/etc/vse/policy.d/10-site.policy.yaml:4:14";
    struct Case<'a> {
        what: &'a str,
        partition: &'a str,
        runs: Vec<Vec<&'a str>>,
        /// Every refusal names this.
        names: &'a str,
    }
    let cases = [
        Case {
            what: "the partition's vCPU limit",
            partition: "small",
            runs: vec![
                vec!["check", spec4],
                launch(["--vcpus", "4"]),
                vec!["run", image, "--vcpus", "4", "--", "true"],
                vec!["spank", "check", "--image", spec4, "--vcpus", "4"],
            ],
            names: small_at,
        },
        Case {
            what: "the partition's hypervisors",
            partition: "vmware",
            runs: vec![
                vec!["check", specq],
                launch(["--hypervisor", "qemu"]),
                vec!["run", image, "--", "true"],
                vec!["spank", "check", "--image", plain],
            ],
            names: vmware_at,
        },
        Case {
            what: "a user's policy widening the site's",
            partition: "",
            runs: vec![
                vec!["check", spec4, "--policy", widen],
                launch(["--policy", widen]),
                vec!["spank", "check", "--image", spec4, "--policies", widen],
            ],
            names: site_at,
        },
    ];
    for c in &cases {
        let env: Vec<(&str, &str)> = if c.partition.is_empty() {
            vec![]
        } else {
            vec![("SLURM_JOB_PARTITION", c.partition)]
        };
        for args in &c.runs {
            let o = vse_as(&t, etc.path(), &env, args);
            let out = all_text(&o);
            assert_eq!(o.status.code(), Some(2), "{}: {args:?}:\n{out}", c.what);
            assert!(
                out.contains(c.names),
                "{}: {args:?} must name {}:\n{out}",
                c.what,
                c.names
            );
            // Outside the partition the same request passes the policy (a missing image is
            // all that stops it), so the partition's file is what refused it.
            if !c.partition.is_empty() {
                let o = vse_as(&t, etc.path(), &[], args);
                let out = all_text(&o);
                assert!(
                    !out.contains(c.names),
                    "{}: {args:?} outside the partition:\n{out}",
                    c.what
                );
            }
        }
    }
    assert!(!Path::new(state_db).exists(), "no controller started");
}
