//! `vse lock SPEC [--policy P]... [--add PKG]... [-o vse.lock] [--json] [--check]`: resolve
//! the effective environment's packages against the Debian repositories into a lockfile
//! (`imgbuild::pipeline::lock`); this prints the lock's summary or its comparison.

use super::build::with_report;
use super::envload::{load_env, shown};
use crate::exit::Failure;
use anyhow::Result;
use clap::Args;
use imgbuild::pipeline::{LockCheck, LockRequest};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vsec::deb::{Relation, parse_relation};
use vsec::lock::{Lockfile, Reason};
use vsec::resolve::{LockOutcome, RepoSelection};

#[derive(Debug, Args)]
#[command(
    after_help = "Repositories: an archive named by the spec (base.mirror) or a policy is used
as named; otherwise the mirrors configured for apt on this host (sources.list{,.d}) for the spec's
suite and its -updates/-security suites, read offline from /var/lib/apt/lists when apt has them.
A policy's mirror rewrite applies to every source.

Examples:
  vse lock specs/minimal.vse.yaml -o minimal.lock
  vse lock specs/mpi-lammps.vse.yaml --policy specs/site.policy.yaml -o lammps.lock
  vse lock specs/minimal.vse.yaml --add strace --json | jq '.packages | length'
  vse lock specs/minimal.vse.yaml -o minimal.lock --check   # exit 3 when out of date"
)]
pub struct LockArgs {
    /// The environment spec (`*.vse.yaml`).
    pub spec: PathBuf,
    /// An admin policy; repeat to stack (site first, then partition).
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<PathBuf>,
    /// Add a package (or `name (>= version)`) for this resolution only, without editing the spec.
    #[arg(long = "add", value_name = "PKG")]
    pub add: Vec<String>,
    /// The lockfile to write (or, with --check, to verify).
    #[arg(short, long, default_value = "vse.lock")]
    pub output: PathBuf,
    /// Verify that the existing lockfile still matches spec, policies and repositories;
    /// writes nothing. Exit 0 when it does, 3 when it is out of date.
    #[arg(long)]
    pub check: bool,
    /// Accept Release files past their Valid-Until (e.g. an old mirror snapshot).
    #[arg(long)]
    pub allow_expired: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(mut a: LockArgs) -> Result<ExitCode> {
    a.policies = super::site::stacked(&a.policies)?;
    // A cold lock parses the indices anyway: the cache file is written after it answers.
    vsec::resolve::defer_writes();
    let env = load_env(&a.spec, &a.policies)?;
    let extra = parse_additions(&a.add)?;
    let req = LockRequest {
        spec: &a.spec,
        policies: &a.policies,
        lock_path: &a.output,
        allow_expired: a.allow_expired,
    };
    let t = Instant::now();
    let LockOutcome {
        lock,
        selection,
        index_cache,
        deferred,
    } = with_report(a.quiet || a.json, |r| {
        imgbuild::pipeline::resolve(&env, &req, &extra, r)
    })
    .map_err(shown)?;
    let took = t.elapsed();
    let index_cache = deferred.map_or(index_cache, |d| d.finish_in_background());
    if a.check {
        let c = imgbuild::pipeline::check_lock(&a.output, &lock).map_err(shown)?;
        return print_check(&a, &c);
    }
    imgbuild::pipeline::write_lock(&lock, &a.output)?;
    if a.json {
        let doc = serde_json::json!({
            "lockfile": a.output,
            "env_hash": lock.env_hash,
            "repositories_from": selection_label(selection),
            "repositories": lock.repositories,
            "index_cache": index_cache,
            "packages": lock.packages,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_summary(&a.output, &lock, selection, took);
        println!("  index cache {index_cache}");
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_additions(add: &[String]) -> Result<Vec<Relation>> {
    add.iter()
        .map(|s| {
            parse_relation(s).map_err(|e| {
                Failure::reword(
                    &e,
                    format!(
                        "--add `{s}`: {e}; expected a package name, optionally with a version \
                     constraint such as `openmpi-bin (>= 4.1)`"
                    ),
                )
                .into()
            })
        })
        .collect()
}

fn print_check(a: &LockArgs, c: &LockCheck) -> Result<ExitCode> {
    if a.json {
        let doc = serde_json::json!({
            "lockfile": a.output,
            "up_to_date": c.up_to_date(),
            "repositories_changed": c.repositories_changed,
            "differences": c.stale.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if c.up_to_date() {
        println!("{} is up to date", a.output.display());
        if c.repositories_changed {
            println!(
                "  note: the repositories were re-signed since; the locked packages are unchanged"
            );
        }
    } else {
        println!("{} is out of date:", a.output.display());
        for d in &c.stale {
            println!("  {d}");
        }
        println!("hint: run `vse lock` again (without --check) to update it");
    }
    Ok(if c.up_to_date() {
        ExitCode::SUCCESS
    } else {
        vse_exit::Exit::OutOfDate.into()
    })
}

fn selection_label(s: RepoSelection) -> &'static str {
    match s {
        RepoSelection::HostLists => "host-apt-lists",
        RepoSelection::HostRemote => "host-apt-sources",
        RepoSelection::Named => "named-archive",
    }
}

fn print_summary(out: &Path, lock: &Lockfile, sel: RepoSelection, took: Duration) {
    let bytes: u64 = lock.packages.iter().map(|p| p.size).sum();
    println!(
        "locked {} packages ({:.1} MiB) in {:.1} s → {}",
        lock.packages.len(),
        bytes as f64 / 1048576.0,
        took.as_secs_f64(),
        out.display()
    );
    println!("  environment {}", lock.env_hash);
    for r in &lock.repositories {
        println!(
            "  repository  {} {} [{}] ({}, {})",
            r.url,
            r.suite,
            r.components.join(" "),
            r.release_date,
            selection_label(sel)
        );
    }
    let count = |f: &dyn Fn(&Reason) -> bool| lock.packages.iter().filter(|p| f(&p.reason)).count();
    println!(
        "  requested {}, policy {}, kernel {}, initramfs {}, base {}, dependencies {}",
        count(&|r| matches!(r, Reason::Requested)),
        count(&|r| matches!(r, Reason::Policy { .. })),
        count(&|r| matches!(r, Reason::Kernel)),
        count(&|r| matches!(r, Reason::Initramfs)),
        count(&|r| matches!(r, Reason::Base { .. })),
        count(&|r| matches!(r, Reason::Dependency { .. })),
    );
    if let Some(k) = lock.kernel() {
        println!("  kernel      {} {}", k.name, k.version);
    }
}
