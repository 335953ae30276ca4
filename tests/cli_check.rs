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

/// Names and descriptions are labels: `vse check` shows the spec's and each policy's (in
/// stacking order, with its file); the spec's are part of the environment's hash (another
/// environment is another image), a policy's are not (relabelling a policy rebuilds nothing).
#[test]
fn names_and_descriptions_are_shown_and_only_the_spec_s_are_hashed() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = |from: &str, to: &str, edit: &dyn Fn(String) -> String| {
        let text = std::fs::read_to_string(root().join(from)).unwrap();
        let path = tmp.path().join(to);
        std::fs::write(&path, edit(text)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let same = |t: String| t;
    let spec = copy("specs/minimal.vse.yaml", "a.vse.yaml", &same);
    let site = copy("specs/site.policy.yaml", "site.policy.yaml", &same);
    let part = copy("specs/partition.policy.yaml", "part.policy.yaml", &same);
    let check = |spec: &str, site: &str| {
        let o = vse(&["check", spec, "--policy", site, "--policy", &part]);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let text = String::from_utf8(o.stdout).unwrap();
        let o = vse(&["check", spec, "--policy", site, "--policy", &part, "--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (text, doc)
    };
    let (text, doc) = check(&spec, &site);
    assert!(
        text.starts_with("valid: environment `minimal` (sha256:"),
        "{text}"
    );
    let labels: Vec<&str> = (text.lines())
        .filter(|l| {
            l.trim_start().starts_with("description") || l.trim_start().starts_with("policy ")
        })
        .collect();
    assert_eq!(
        labels,
        [
            "  description                Static busybox shell on the Debian cloud kernel"
                .to_string(),
            format!(
                "  policy                     site ({site}): Cluster-wide rules set by the HPC admins"
            ),
            format!(
                "  policy                     compute ({part}): Rules of the compute partition (no oversubscription, QEMU or libvirt only)"
            ),
        ]
    );
    assert_eq!(doc["policies"][1]["name"], "compute", "{doc}");
    let hash = doc["env_hash"].clone();
    let renamed = copy("specs/minimal.vse.yaml", "b.vse.yaml", &|t| {
        t.replace("\nname: minimal", "\nname: minimal2")
    });
    let redescribed = copy("specs/minimal.vse.yaml", "c.vse.yaml", &|t| {
        t.replace("\ndescription: Static", "\ndescription: A static")
    });
    for other in [&renamed, &redescribed] {
        assert_ne!(check(other, &site).1["env_hash"], hash, "{other}");
    }
    let relabelled = copy("specs/site.policy.yaml", "site2.policy.yaml", &|t| {
        t.replace("\nname: site", "\nname: site2")
            .replace("\ndescription: Cluster", "\ndescription: All")
    });
    let (text, doc) = check(&spec, &relabelled);
    assert!(text.contains(" site2 ("), "{text}");
    assert_eq!(doc["env_hash"], hash);
}

/// `vse check … | head`: a reader that goes away ends vse quietly (SIGPIPE, as for `cat`),
/// not with a panic's backtrace.
#[test]
fn a_closed_stdout_ends_check_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_vse"))
        .args(["check", "specs/minimal.vse.yaml"])
        .current_dir(root())
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{o:?}");
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// What a spec leaves out, the policies' `defaults` fill, named by their line: the effective
/// environment every command then uses (a launch's VMs take `resources.vcpus` from it, and its
/// checkpoints `checkpoint.mode`).
#[test]
fn policy_defaults_fill_what_a_spec_leaves_out() {
    let tmp = tempfile::tempdir().unwrap();
    let minimal = std::fs::read_to_string(root().join("specs/minimal.vse.yaml")).unwrap();
    let bare: String = (minimal.lines())
        .filter(|l| {
            !["resources:", "  vcpus:", "  memory:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let spec = tmp.path().join("bare.vse.yaml");
    std::fs::write(&spec, bare).unwrap();
    let policy = tmp.path().join("defaults.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: defaults\ndefaults:\n  vcpus: 3\n  checkpoint: walltime-end\n",
    )
    .unwrap();
    let (spec, policy) = (spec.to_str().unwrap(), policy.to_str().unwrap());
    let o = vse(&["check", spec, "--policy", policy, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let env = &doc["environment"];
    assert_eq!(env["resources"]["vcpus"]["value"], 3, "{env}");
    assert_eq!(
        env["resources"]["vcpus"]["from"]["at"],
        format!("{policy}:4:10")
    );
    assert_eq!(env["checkpoint"]["mode"]["value"], "walltime-end", "{env}");
    assert_eq!(env["checkpoint"]["at_walltime_end"]["value"], true);
    assert_eq!(
        env["checkpoint"]["mode"]["from"]["at"],
        format!("{policy}:5:15")
    );
    // Without the policy, the built-in defaults.
    let o = vse(&["check", spec, "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["environment"]["resources"]["vcpus"]["value"], 1);
    assert_eq!(doc["environment"]["checkpoint"]["mode"]["value"], "never");
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
    // Each field's row says where it takes effect, once.
    let after = |key: &str| {
        let mut it = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(key));
        it.nth(1).unwrap_or_default().trim().to_string()
    };
    assert_eq!(
        after("resources.vcpus"),
        format!(
            "takes effect: {}",
            vsec::fields::effect_of("resources.vcpus").unwrap().applied
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("takes effect: vse lock and build: installed in the image")
            .count(),
        1,
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

/// The `--long` flags in `text`.
fn flags(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = (text[i + 2..].chars())
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.len() > 1 && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{name}"));
        }
    }
    out
}

/// The README's command table and environment table against `vse --help`, both ways: every
/// command, flag and variable the README names exists, and everything `--help` offers is in
/// the README.
#[test]
fn the_readme_names_what_help_offers_and_nothing_else() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let top = String::from_utf8_lossy(&vse(&["--help"]).stdout).into_owned();
    let listed = top
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap();
    let commands: Vec<&str> = (listed.lines())
        // A command's own line; a wrapped description's lines are indented further.
        .filter_map(|l| {
            l.strip_prefix("  ")
                .filter(|r| !r.starts_with(' '))?
                .split_whitespace()
                .next()
        })
        .filter(|c| *c != "help" && c.chars().all(|ch| ch.is_ascii_lowercase()))
        .collect();
    assert!(commands.len() >= 12, "{top}");
    let rows: Vec<&str> = (readme.lines())
        .filter(|l| l.starts_with("| `vse "))
        .collect();
    let in_readme: std::collections::BTreeSet<&str> = (rows.iter())
        .filter_map(|r| r["| `vse ".len()..].split([' ', '`']).next())
        .collect();
    assert_eq!(
        in_readme,
        commands.iter().copied().collect(),
        "the README's command table against `vse --help`"
    );
    for c in &commands {
        let help = String::from_utf8_lossy(&vse(&[c, "--help"]).stdout).into_owned();
        let offered = flags(&help);
        let row: String = (rows.iter())
            .filter(|r| r["| `vse ".len()..].split([' ', '`']).next() == Some(c))
            .map(|r| r.split(" | ").next().unwrap_or_default())
            .collect();
        let named = flags(&row);
        let unknown: Vec<_> = named.difference(&offered).collect();
        assert!(
            unknown.is_empty(),
            "README's `vse {c}` row names {unknown:?}, which `vse {c} --help` does not offer"
        );
        let everywhere = flags(&readme);
        let undocumented: Vec<_> = (offered.iter())
            .filter(|f| !["--help", "--version"].contains(&f.as_str()) && !everywhere.contains(*f))
            .collect();
        assert!(
            undocumented.is_empty(),
            "`vse {c} --help` offers {undocumented:?}, which the README never names"
        );
    }
    // Variables: the README's table rows for vse itself (not those for building or testing it).
    let env_help: std::collections::BTreeSet<&str> =
        (top.split("Environment:").nth(1).unwrap().lines())
            .filter_map(|l| l.split_whitespace().next())
            .filter(|v| v.starts_with("VSE_"))
            .collect();
    let table = readme.split("## Environment variables").nth(1).unwrap();
    let env_readme: std::collections::BTreeSet<&str> = (table.lines())
        .filter(|l| !l.contains("| tests:") && !l.contains("| building vse"))
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .filter(|v| v.starts_with("VSE_"))
        .collect();
    assert_eq!(
        env_readme, env_help,
        "the README's variables against `vse --help`'s"
    );
}

/// The README's "Repository layout" table has a row for every workspace member's top-level
/// directory (the root package's is `src/`).
#[test]
fn the_readme_layout_lists_every_workspace_member() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members: Vec<&str> = (manifest.split_once("members = [").unwrap().1)
        .split_once(']')
        .unwrap()
        .0
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.len() > 10, "{members:?}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table = (readme.split("## Repository layout").nth(1).unwrap())
        .split("\n## ")
        .next()
        .unwrap();
    // The paths of each row's first cell: `| `spank/`, `plugins/spank/` | …`.
    let listed: std::collections::BTreeSet<&str> = (table.lines())
        .filter_map(|l| l.strip_prefix("| ")?.split(" | ").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .collect();
    let missing: Vec<String> = (members.iter())
        .map(|m| match m.split('/').next().unwrap() {
            "." => "src/".to_owned(),
            top => format!("{top}/"),
        })
        .filter(|dir| !listed.contains(dir.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "README's Repository layout has no row for {missing:?} (listed: {listed:?})"
    );
}

/// `vse` with `args` in `dir`, killed after `limit` (a hang is a failure, not a stuck CI).
fn vse_within(dir: &Path, args: &[&str], envs: &[(&str, &str)], limit: u64) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vse"));
    c.args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vse");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(std::time::Duration::from_secs(limit)) {
        Ok(out) => out.expect("vse's output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("vse {args:?} still running after {limit} s");
        }
    }
}

/// Every path a user gives a command, given as something that is not what it should be: a
/// FIFO (which would block an open), a device that never ends, a directory, a symlink loop,
/// a non-UTF-8 file, a missing file. Each is refused at once with exit 2 naming the path,
/// and nothing is written.
#[test]
fn bad_paths_exit_2_at_once_naming_them_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
    std::fs::create_dir(d.join("dir")).unwrap();
    std::fs::write(d.join("nonutf8"), b"\xff\xfe\n").unwrap();
    let bad = ["fifo", "/dev/zero", "dir", "loop", "nonutf8", "missing"];
    let commands: &[&[&str]] = &[
        &["check", "@"],
        &["lock", "@", "-o", "out.lock"],
        &["build", "@", "-o", "out"],
        &["run", "@", "--", "true"],
        &["launch", "@", "--allocation", "local:1", "--", "true"],
        &["sign", "@", "--key", "@"],
        &["check", "specs/minimal.vse.yaml", "--policy", "@"],
    ];
    let specs = root().join("specs");
    std::os::unix::fs::symlink(&specs, d.join("specs")).unwrap();
    for path in bad {
        for cmd in commands {
            let args: Vec<&str> = cmd
                .iter()
                .map(|a| if *a == "@" { path } else { a })
                .collect();
            let o = vse_within(
                d,
                &args,
                &[("VSE_RUN_DIR", "run"), ("VSE_STATE_DB", "state.db")],
                30,
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "vse {args:?}: {err}");
            assert!(
                err.contains(path),
                "vse {args:?} does not name {path}: {err}"
            );
        }
    }
    let mut left: Vec<_> = (std::fs::read_dir(d).unwrap().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["dir", "fifo", "loop", "nonutf8", "specs"],
        "written by a refused command"
    );
}

/// `vse bench stage` runs the real staging code both ways, every node's server in its own
/// process (`vse bench stage-node`) included, and leaves no node process or copy behind.
#[test]
fn bench_stage_stages_in_process_and_to_node_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("image");
    std::fs::create_dir(&image).unwrap();
    let noise: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(image.join("root.ext4"), noise).unwrap();
    std::fs::write(image.join("manifest.json"), b"{}").unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_vse"))
        .args([
            "bench",
            "stage",
            "--nodes",
            "3",
            "--no-sbcast",
            "--levels",
            "1",
        ])
        .args(["--incompressible-mib", "0", "--json", "--image"])
        .arg(&image)
        .arg("--dir")
        .arg(&work)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = &doc["staging"][0];
    assert_eq!(row["nodes"], 3, "{doc}");
    for k in ["vse_s", "vse_processes_s"] {
        assert!(row[k].as_f64().is_some_and(|s| s > 0.0), "{k}: {doc}");
    }
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "copies left in {}",
        work.display()
    );
    let ps = Command::new("pgrep")
        .args(["-f", "bench stage-node"])
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "node processes left: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
}
