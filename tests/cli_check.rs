//! `vse check` as a script sees it: exit codes, stdout/stderr, `--json`, `--explain`, run
//! on every file in `specs/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn vse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vse"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run vse")
}

fn files(dir: &str, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    v.sort();
    v
}

const STACK: [&str; 4] = [
    "--policy",
    "specs/site.policy.yaml",
    "--policy",
    "specs/partition.policy.yaml",
];

#[test]
fn every_example_checks_ok_with_exit_0() {
    for spec in files("specs", ".vse.yaml") {
        let mut args = vec!["check", spec.as_str()];
        args.extend(STACK);
        let out = vse(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{spec}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.starts_with("valid: environment `"),
            "{spec}: {stdout}"
        );
        assert!(stdout.contains("base.mirror"), "{stdout}");
    }
}

#[test]
fn json_output_is_one_document_with_a_stable_hash() {
    let mut args = vec!["check", "specs/mpi-lammps.vse.yaml", "--json"];
    args.extend(STACK);
    let a = vse(&args);
    let b = vse(&args);
    assert_eq!(a.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&a.stdout).expect("JSON on stdout");
    assert_eq!(doc["valid"], true);
    let hash = doc["env_hash"].as_str().unwrap();
    assert!(
        hash.starts_with("sha256:") && hash.len() == 7 + 64,
        "{hash}"
    );
    assert_eq!(a.stdout, b.stdout, "output must be deterministic");
    let env = &doc["environment"];
    assert_eq!(env["resources"]["vcpus"]["value"], 4);
    assert_eq!(env["resources"]["vcpus"]["from"]["kind"], "user");
    assert_eq!(env["resources"]["memory"]["value"], 4u64 << 30);
    assert_eq!(env["limits"]["max_vcpus"]["value"], 16);
    assert_eq!(
        env["limits"]["max_vcpus"]["from"]["at"],
        "specs/partition.policy.yaml:6:14"
    );
    assert_eq!(env["migration"]["persistence_k"]["value"], 3);
}

#[test]
fn explain_names_the_origin_of_values() {
    let mut args = vec!["check", "specs/python-numpy.vse.yaml", "--explain"];
    args.extend(STACK);
    let out = vse(&args);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in\n{text}"))
            .to_string()
    };
    assert!(
        line("resources.vcpus").ends_with("<- user specs/python-numpy.vse.yaml:16:10"),
        "{text}"
    );
    assert!(
        line("hypervisor.preferred").contains("<- policy specs/partition.policy.yaml:"),
        "{text}"
    );
    assert!(
        line("base.install_recommends").ends_with("<- default"),
        "{text}"
    );
    assert!(
        line("base.mirror").contains("the host's apt sources"),
        "{text}"
    );
}

fn case_policies(spec: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&std::fs::read(root().join(spec)).unwrap()).into_owned();
    let dir = Path::new(spec).parent().unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("# policies:"));
    line.map(|l| {
        l.split_whitespace()
            .map(|p| {
                let joined = dir.join(p);
                let mut parts: Vec<&str> = Vec::new();
                for c in joined.to_str().unwrap().split('/') {
                    if c == ".." {
                        parts.pop();
                    } else {
                        parts.push(c);
                    }
                }
                parts.join("/")
            })
            .collect()
    })
    .unwrap_or_default()
}

#[test]
fn invalid_cases_exit_2_with_the_golden_stderr() {
    for spec in files("specs/invalid", ".vse.yaml") {
        let pols = case_policies(&spec);
        let mut args = vec!["check".to_string(), spec.clone()];
        for p in &pols {
            args.push("--policy".into());
            args.push(p.clone());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = vse(&argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {stderr}");
        let want =
            std::fs::read_to_string(root().join(spec.replace(".vse.yaml", ".expected"))).unwrap();
        assert!(
            stderr.starts_with(&want),
            "{spec}:\n--- expected prefix\n{want}--- got\n{stderr}"
        );
        let last = stderr.lines().last().unwrap_or("");
        assert!(
            last.starts_with(&format!("error: {spec}: ")) && last.ends_with("found"),
            "{last}"
        );
        assert!(
            out.stdout.is_empty(),
            "nothing on stdout for an invalid spec"
        );
    }
}

#[test]
fn missing_file_is_invalid_input() {
    let out = vse(&["check", "specs/does-not-exist.vse.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read specs/does-not-exist.vse.yaml")
    );
}

#[test]
fn invalid_json_lists_problems_on_stdout() {
    let out = vse(&["check", "specs/invalid/bad-values.vse.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["valid"], false);
    let problems = doc["problems"].as_array().unwrap();
    assert!(problems.len() >= 5, "{problems:?}");
    assert!(problems.iter().all(|p| {
        p["at"]
            .as_str()
            .unwrap()
            .starts_with("specs/invalid/bad-values.vse.yaml:")
    }));
}

#[test]
fn help_lists_every_exit_code() {
    let out = vse(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for (code, meaning) in [
        (0, "success"),
        (2, "or a missing system component"),
        (3, "the lockfile is out of date"),
        (101, "an agent or node failed"),
        (102, "the image could not be staged"),
        (103, "a VM could not boot or run the command"),
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{code}  ")) && l.contains(meaning)),
            "no exit code {code} in\n{help}"
        );
    }
}

/// A spec named without a directory (run from its own) copies files from the current one.
#[test]
fn files_source_next_to_a_spec_named_without_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let spec = std::fs::read_to_string(root().join("specs/minimal.vse.yaml")).unwrap();
    std::fs::write(
        d.path().join("s.vse.yaml"),
        format!("{spec}files:\n  - path: /etc/x.txt\n    source: x.txt\n"),
    )
    .unwrap();
    std::fs::write(d.path().join("x.txt"), "x").unwrap();
    let hash = |spec: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_vse"))
            .args(["check", "--json"])
            .arg(spec)
            .current_dir(d.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["env_hash"].as_str().unwrap().to_string()
    };
    // However the spec is named, the environment is the same (a lock made one way is valid
    // for a build started the other way).
    assert_eq!(
        hash(Path::new("s.vse.yaml")),
        hash(&d.path().join("s.vse.yaml"))
    );
}
