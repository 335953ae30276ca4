//! Golden tests over `specs/`: every example must be valid (alone and against the stacked
//! example policies), and every case in `specs/invalid/` must fail with exactly the
//! diagnostics in its `.expected` file. `VSE_BLESS=1` rewrites the `.expected` files (refused
//! under CI).

use std::path::{Path, PathBuf};
use vsec::yaml::{Diagnostics, Source};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Reads `rel` (relative to the repo root) and names it as a user would type it from there.
fn source(rel: &str) -> Source {
    let path = root().join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    Source::from_bytes(rel, &path, bytes)
}

fn check(spec: &str, policies: &[String]) -> Result<vsec::env::EffectiveEnv, Diagnostics> {
    let mut diags = Diagnostics::default();
    let spec = vsec::spec::parse_source(&source(spec))
        .map_err(|d| diags.extend(d))
        .ok();
    let pols: Vec<_> = policies
        .iter()
        .filter_map(|p| {
            vsec::policy::parse_source(&source(p))
                .map_err(|d| diags.extend(d))
                .ok()
        })
        .collect();
    match spec {
        Some(s) if diags.is_empty() => vsec::merge::merge(&s, &pols),
        _ => Err(diags),
    }
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

const STACK: [&str; 2] = ["specs/site.policy.yaml", "specs/partition.policy.yaml"];

#[test]
fn every_example_is_valid_alone_and_under_the_stacked_policies() {
    let specs = files("specs", ".vse.yaml");
    assert!(
        specs.len() >= 6,
        "expected at least six example specs, found {specs:?}"
    );
    let stack: Vec<String> = STACK.iter().map(|s| s.to_string()).collect();
    for spec in &specs {
        let alone = check(spec, &[]).unwrap_or_else(|d| panic!("{spec} alone:\n{d}"));
        let site = check(spec, &stack[..1]).unwrap_or_else(|d| panic!("{spec} + site:\n{d}"));
        let both =
            check(spec, &stack).unwrap_or_else(|d| panic!("{spec} + site + partition:\n{d}"));
        assert_eq!(alone.name.value, both.name.value);
        // The policy fills and narrows: site libraries are always required...
        assert!(
            both.required_packages
                .iter()
                .any(|p| p.value.name.as_str() == "libnuma1")
        );
        assert!(site.forbidden.iter().any(|p| p.value.glob() == "telnetd"));
        // ...and the partition's tighter limit is the one in force.
        assert_eq!(both.limits.max_vcpus.as_ref().unwrap().value, 16);
        assert_eq!(both.limits.vms_per_core.value, 1);
        assert!(both.network.is_some());
    }
}

#[test]
fn example_policies_are_valid_on_their_own() {
    for p in files("specs", ".policy.yaml") {
        vsec::policy::parse_source(&source(&p)).unwrap_or_else(|d| panic!("{p}:\n{d}"));
    }
}

/// Policies named on a `# policies: a b` line, relative to the case's directory.
fn case_policies(spec: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&std::fs::read(root().join(spec)).unwrap()).into_owned();
    let dir = Path::new(spec).parent().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# policies:"))
        .map(|l| {
            l.split_whitespace()
                .map(|p| normalize(&dir.join(p)))
                .collect()
        })
        .unwrap_or_default()
}

fn normalize(p: &Path) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.to_str().unwrap().split('/') {
        match c {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            _ => parts.push(c),
        }
    }
    parts.join("/")
}

#[test]
fn invalid_cases_fail_with_the_expected_diagnostics() {
    let cases = files("specs/invalid", ".vse.yaml");
    assert!(cases.len() >= 10, "{cases:?}");
    let mut failures = Vec::new();
    for spec in &cases {
        let expected_path = root().join(spec.replace(".vse.yaml", ".expected"));
        let got = match check(spec, &case_policies(spec)) {
            Ok(_) => "(valid: no diagnostics)".to_string(),
            Err(d) => format!("{d}\n"),
        };
        failures.extend(testkit::golden::mismatch(&expected_path, &got));
    }
    assert!(
        failures.is_empty(),
        "{}\n(re-bless with VSE_BLESS=1 after checking)",
        failures.join("\n")
    );
}

#[test]
fn a_policy_walltime_checkpoint_rule_holds_even_when_the_spec_says_never() {
    let spec = Source::from_bytes(
        "never.vse.yaml",
        Path::new("never.vse.yaml"),
        b"version: 1\nname: never\nbase:\n  distribution: debian\n  suite: bookworm\ncheckpoint:\n  mode: never\n".to_vec(),
    );
    let pol = Source::from_bytes(
        "ckpt.policy.yaml",
        Path::new("ckpt.policy.yaml"),
        b"version: 1\nname: ckpt\ncheckpoint:\n  at_walltime_end: true\n  min_interval: 30m\n"
            .to_vec(),
    );
    let spec = vsec::spec::parse_source(&spec).unwrap();
    let pol = vsec::policy::parse_source(&pol).unwrap();
    let env = vsec::merge::merge(&spec, &[pol]).unwrap();
    let c = &env.checkpoint;
    assert_eq!(c.mode.value, vsec::env::CheckpointMode::Never);
    assert!(c.at_walltime_end.value, "the policy's rule wins");
    assert!(matches!(
        c.at_walltime_end.from,
        vsec::env::Origin::Policy { .. }
    ));
    assert_eq!(c.min_interval.as_ref().map(|m| m.value.get()), Some(1800));
}

#[test]
fn a_later_policy_may_shorten_the_attach_grace_but_never_lengthen_it() {
    let src = |name: &str, grace: &str| {
        let text = format!("version: 1\nname: {name}\ncheckpoint:\n  attach_grace: {grace}\n");
        let file = format!("{name}.policy.yaml");
        let s = Source::from_bytes(&file, Path::new(&file), text.into_bytes());
        vsec::policy::parse_source(&s).unwrap()
    };
    let spec = Source::from_bytes(
        "plain.vse.yaml",
        Path::new("plain.vse.yaml"),
        b"version: 1\nname: plain\nbase:\n  distribution: debian\n  suite: bookworm\n".to_vec(),
    );
    let spec = vsec::spec::parse_source(&spec).unwrap();
    let env = vsec::merge::merge(&spec, &[src("site", "2m"), src("group", "30s")]).unwrap();
    let g = env
        .checkpoint
        .attach_grace
        .as_ref()
        .expect("the policies set it");
    assert_eq!(g.value.get(), 30);
    let longer = vsec::merge::merge(&spec, &[src("site", "30s"), src("group", "5m")]);
    let err = format!("{:?}", longer.expect_err("a later policy may only narrow"));
    assert!(err.contains("checkpoint.attach_grace"), "{err}");
}
