//! `vse bench …`: benchmarks that print figures (never timed assertions in tests). The
//! measuring is the vse-bench library's (`bench/`); this draws progress and prints each
//! report as text or, with `--json`, as one JSON document.

use anyhow::{Context, Result};
use bench::Step;
use bench::build::BuildBench;
use bench::launch::LaunchBench;
use bench::migrate::MigrateBench;
use bench::monitor::MonitorBench;
use bench::resolve::ResolveBench;
use bench::stage::StageBench;
use bench::vm::VmBench;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Image builds: warm-cache build vs mmdebstrap, no-op rebuild, boot overhead vs plain QEMU.
    Build(BuildBench),
    /// Launcher: agent bootstrap at scale, failure-detection latency.
    Launch(LaunchBench),
    /// Migration: prediction to completed barrier-coordinated migration vs raw QEMU migration;
    /// node-local disks (vse's block copy vs drive-mirror by hand); `vse evacuate` of an MPI job.
    Migrate(MigrateBench),
    /// Monitoring: sampler cost, controller ingest rate, rule evaluation, trigger latency.
    Monitor(MonitorBench),
    /// Resolver: parse + resolve time against the full Debian index, next to `apt-get install -s`.
    Resolve(ResolveBench),
    /// Shares: large-file write and read and small-file creation through a share vs the VM's
    /// own disk vs the host.
    Share(bench::share::ShareBench),
    /// Staging: the image to N nodes vs `sbcast`, `sbcast --compress` and the `dd` limit.
    Stage(StageBench),
    /// V2M: boot-to-ready vs plain QEMU, pause/resume latency, live migration, checkpoint/restore.
    Vm(VmBench),
    /// A worker process of the bootstrap benchmark: hosts simulated agents (internal).
    #[command(hide = true)]
    SimWorker,
    /// A node process of the staging benchmark: one staging server (internal).
    #[command(hide = true)]
    StageNode,
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Build(a) => build(&a),
        BenchCommand::Launch(a) => {
            let vse = vse_exe()?;
            let r = spin(!a.json, false, |s| bench::launch::run(&a, &vse, s))?;
            show(a.json, &r.json(), &r)
        }
        BenchCommand::Migrate(a) => {
            let vse = vse_exe()?;
            let r = spin(!a.json, true, |s| bench::migrate::run(&a, &vse, s))?;
            show(a.json, &r.json(), &r)
        }
        BenchCommand::Monitor(a) => {
            let r = spin(!a.json, false, |s| bench::monitor::run(&a, s))?;
            show(a.json, &r.json(), &r)
        }
        BenchCommand::Resolve(a) => {
            let vse = vse_exe()?;
            let r = spin(true, true, |s| bench::resolve::run(&a, &vse, s))?;
            show(a.json, &r.json(), &r)?;
            Ok(if r.all_valid() {
                ExitCode::SUCCESS
            } else {
                vse_exit::Exit::Internal.into()
            })
        }
        BenchCommand::Share(a) => {
            let vse = vse_exe()?;
            let r = spin(!a.json, false, |s| bench::share::run(&a, &vse, s))?;
            show(a.json, &serde_json::to_value(&r)?, &r)
        }
        BenchCommand::Stage(a) => {
            let vse = vse_exe()?;
            let r = spin(!a.json, true, |s| bench::stage::run(&a, &vse, s))?;
            show(a.json, &r.json(), &r)
        }
        BenchCommand::Vm(a) => {
            let r = spin(!a.json, false, |s| bench::vm::run(&a, s))?;
            show(a.json, &serde_json::to_value(&r)?, &r)
        }
        BenchCommand::SimWorker => {
            bench::bootstrap::worker()?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::StageNode => {
            launcher::stage::serve_node()?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Each spec's figures as they complete (text), or all of them at the end (JSON).
fn build(a: &BuildBench) -> Result<ExitCode> {
    let vse = vse_exe()?;
    let env = bench::build::Env {
        vse: &vse,
        agent: crate::guest_agent::choose(None),
        step: &|m: &str| eprintln!("bench build: {m}"),
    };
    let rows = bench::build::run(a, &env, &mut |row| {
        if !a.json {
            print!("{row}");
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn vse_exe() -> Result<std::path::PathBuf> {
    std::env::current_exe().context("locating the vse binary")
}

fn show(json: bool, doc: &serde_json::Value, text: &dyn Display) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(doc)?);
    } else {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `f` with its steps on a spinner (when `visible`; `timed` adds the elapsed time).
fn spin<T>(visible: bool, timed: bool, f: impl FnOnce(Step) -> T) -> T {
    let bar = visible.then(|| {
        let b = ProgressBar::new_spinner();
        if timed && let Ok(s) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
            b.set_style(s);
        }
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let step = |m: &str| {
        if let Some(b) = &bar {
            b.set_message(m.to_string());
        }
    };
    let out = f(&step);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    out
}
