//! 30+ real requests resolved against the host's Debian indices, judged by apt itself:
//! 1. validity: the locked set, written as a dpkg status file, passes `apt-get check`
//!    (every Depends/Pre-Depends satisfied, no Conflicts/Breaks violated);
//! 2. no bloat: the closure is within 10% of what `apt-get install -s` installs for the same
//!    request plus the same base set (minbase: Essential + Priority required), from an
//!    empty status.
//!
//! Figures are printed (`cargo test -- --nocapture` or nextest's output).

mod apt_oracle_common;

use apt_oracle_common::*;
use vsec::deb::parse_relation;
use vsec::lock::Reason;
use vsec::resolve::{BaseVariant, RequestedPackage, ResolveRequest, resolve_in};

fn run_requests(group: &str, requests: &[&str]) {
    if !host_ready() {
        return;
    }
    let u = universe();
    let dir = tempfile::tempdir().unwrap();
    let sandbox = vsec::resolve::apt::AptSandbox {
        dir: dir.path().to_path_buf(),
    };
    let base: Vec<String> = vsec::resolve::base_names(u, BaseVariant::Minbase)
        .into_iter()
        .map(|n| n.to_string())
        .collect();
    let mut failures = Vec::new();
    for req in requests {
        let names: Vec<&str> = req.split_whitespace().collect();
        let request = ResolveRequest {
            variant: BaseVariant::Minbase,
            recommends: false,
            packages: names
                .iter()
                .map(|n| RequestedPackage {
                    relation: parse_relation(n).unwrap(),
                    reason: Reason::Requested,
                })
                .collect(),
            forbidden: vec![],
        };
        let res = match resolve_in(u, &request) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{req}: vse failed: {e}"));
                continue;
            }
        };
        let pkgs: Vec<_> = res.packages.iter().map(|p| package_of(u, p)).collect();
        let valid = sandbox.check(&pkgs);
        let mut apt_names = base.clone();
        apt_names.extend(names.iter().map(|s| s.to_string()));
        let apt_set = match sandbox.simulate(&apt_names) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{req}: apt-get install -s failed: {e}"));
                continue;
            }
        };
        let (ours, theirs) = (res.packages.len(), apt_set.len());
        let diff = (ours as f64 - theirs as f64) / theirs as f64 * 100.0;
        eprintln!(
            "apt-oracle [{group}] {req:<40} vse {ours:>4}  apt {theirs:>4}  diff {diff:>+6.1}%  apt-get check: {}  (steps {}, backtracks {})",
            if valid.is_ok() { "ok" } else { "BROKEN" },
            res.steps,
            res.backtracks
        );
        if let Err(e) = valid {
            failures.push(format!("{req}: apt-get check rejects the locked set:\n{e}"));
        }
        if diff.abs() > 10.0 {
            let ours_names: std::collections::BTreeSet<String> =
                res.packages.iter().map(|p| p.name.to_string()).collect();
            let theirs_names: std::collections::BTreeSet<String> = apt_set.into_iter().collect();
            failures.push(format!(
                "{req}: closure {ours} vs apt {theirs} ({diff:+.1}%); only vse: {:?}; only apt: {:?}",
                ours_names.difference(&theirs_names).collect::<Vec<_>>(),
                theirs_names.difference(&ours_names).collect::<Vec<_>>()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn hpc_stacks_match_apt() {
    run_requests(
        "hpc",
        &[
            "openmpi-bin",
            "libopenmpi-dev",
            "mpich",
            "lammps",
            "gromacs",
            "python3-mpi4py",
            "libhdf5-openmpi-dev",
            "libfftw3-dev",
            "libscalapack-openmpi-dev",
            "hwloc numactl",
            "slurm-client munge",
        ],
    );
}

#[test]
fn scientific_python_and_languages_match_apt() {
    run_requests(
        "lang",
        &[
            "python3-numpy",
            "python3-scipy",
            "python3-pandas",
            "python3-matplotlib",
            "r-base-core",
            "gfortran",
            "build-essential",
            "cmake",
            "openjdk-17-jre-headless",
            "octave",
            "perl",
        ],
    );
}

#[test]
fn system_tools_match_apt() {
    run_requests(
        "sys",
        &[
            "openssh-server",
            "openssh-client",
            "curl",
            "wget",
            "git",
            "rsync",
            "vim",
            "gdb",
            "valgrind",
            "sudo",
            "iproute2",
            "ca-certificates",
        ],
    );
}
