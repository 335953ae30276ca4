//! `vse lock SPEC [--policy P]... [--add PKG]... [-o vse.lock] [--json] [--check]`: resolve
//! the effective environment's packages against the Debian repositories into a lockfile.

use super::envload::{load_env, relative_to};
use crate::exit::Failure;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vsec::deb::{Relation, parse_relation};
use vsec::env::EffectiveEnv;
use vsec::lock::{Lockfile, Reason, SourceFiles};
use vsec::repo::ValidityCheck;
use vsec::resolve::{HostApt, LockDifference, LockOutcome, RepoSelection, compare_locks, lock_env};

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

pub fn run(a: LockArgs) -> Result<ExitCode> {
    let env = load_env(&a.spec, &a.policies)?;
    let extra = parse_additions(&a.add)?;
    let t = Instant::now();
    let LockOutcome {
        lock,
        selection,
        index_cache,
    } = resolve(&env, &a, &extra)?;
    let took = t.elapsed();
    if a.check {
        return check(&a, &lock);
    }
    lock.write(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
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

/// Resolves with a spinner on a terminal; used by `vse build SPEC` too.
pub fn resolve(env: &EffectiveEnv, a: &LockArgs, extra: &[Relation]) -> Result<LockOutcome> {
    let lock_dir = a
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let source = SourceFiles {
        spec: relative_to(&a.spec, lock_dir),
        policies: a
            .policies
            .iter()
            .map(|p| relative_to(p, lock_dir))
            .collect(),
    };
    let validity = if a.allow_expired {
        ValidityCheck::Ignore
    } else {
        ValidityCheck::Now
    };
    let spinner = (!a.quiet && !a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = ProgressBar::new_spinner();
        if let Ok(s) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
            pb.set_style(s);
        }
        pb.enable_steady_tick(Duration::from_millis(120));
        pb.set_message("verifying the repositories and resolving");
        pb
    });
    let r = lock_env(env, extra, &HostApt::detect(), validity, source);
    if let Some(pb) = spinner {
        pb.finish_and_clear();
    }
    r.map_err(|e| Failure::reword(&e, format!("resolving {}: {e}", a.spec.display())).into())
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

fn check(a: &LockArgs, now: &Lockfile) -> Result<ExitCode> {
    let locked = Lockfile::read(&a.output).map_err(|e| {
        Failure::reword(
            &e,
            format!("{e}; hint: run `vse lock` without --check to create it"),
        )
    })?;
    let diffs = compare_locks(&locked, now);
    // A newer Release file alone (security suites are re-signed daily) does not make the
    // lock wrong: the packages it pins are what resolving gives today.
    let stale: Vec<&LockDifference> = diffs
        .iter()
        .filter(|d| !matches!(d, LockDifference::Repositories))
        .collect();
    if a.json {
        let doc = serde_json::json!({
            "lockfile": a.output,
            "up_to_date": stale.is_empty(),
            "repositories_changed": diffs.len() != stale.len(),
            "differences": stale.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if stale.is_empty() {
        println!("{} is up to date", a.output.display());
        if diffs.len() != stale.len() {
            println!(
                "  note: the repositories were re-signed since; the locked packages are unchanged"
            );
        }
    } else {
        println!("{} is out of date:", a.output.display());
        for d in &stale {
            println!("  {d}");
        }
        println!("hint: run `vse lock` again (without --check) to update it");
    }
    Ok(if stale.is_empty() {
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

/// The lock that gives an image made elsewhere (`vse import`) its kernel and initramfs:
/// `from` as given (a lockfile, or a spec resolved under `policies`), else the default kernel
/// of an environment on the host's own Debian suite, resolved under `policies` against the
/// host's apt sources exactly as `vse lock` would.
pub fn lock_kernel(
    from: Option<&Path>,
    policies: &[PathBuf],
    allow_expired: bool,
    quiet: bool,
) -> Result<Lockfile> {
    let args = |spec: &Path| LockArgs {
        spec: spec.to_path_buf(),
        policies: policies.to_vec(),
        add: vec![],
        output: std::env::temp_dir().join("vse-import.lock"),
        check: false,
        allow_expired,
        json: false,
        quiet,
    };
    match from {
        Some(p) if super::build::is_spec(p) => {
            Ok(resolve(&load_env(p, policies)?, &args(p), &[])?.lock)
        }
        Some(p) => Ok(Lockfile::read(p).map_err(|e| Failure::invalid(e.to_string()))?),
        None => {
            let suite = vsec::repo::host_sources(Path::new("/"))
                .ok()
                .and_then(|s| s.into_iter().map(|e| e.suite).find(|s| !s.contains('-')))
                .ok_or_else(|| {
                    Failure::invalid(
                        "this host has no apt source for a Debian suite to take a kernel from; \
                         hint: pass --kernel-from LOCK|SPEC",
                    )
                })?;
            let name = "<vse import: default kernel>";
            let yaml = format!(
                "version: 1\nname: imported\nbase:\n  distribution: debian\n  suite: {suite}\n  variant: essential\n"
            );
            let src = vsec::yaml::Source::from_bytes(name, Path::new("."), yaml.into_bytes());
            let spec =
                vsec::spec::parse_source(&src).map_err(|d| Failure::invalid(d.to_string()))?;
            let mut loaded = Vec::new();
            for p in policies {
                loaded.push(vsec::policy::load(p).map_err(|e| Failure::invalid(e.to_string()))?);
            }
            let env = vsec::merge::merge(&spec, &loaded).map_err(|d| {
                Failure::invalid(format!(
                    "the default kernel environment ({suite}) under the policies:\n{d}\nhint: pass --kernel-from LOCK|SPEC"
                ))
            })?;
            Ok(resolve(&env, &args(Path::new(name)), &[])?.lock)
        }
    }
}
