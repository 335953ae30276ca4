//! `vse bench …`: benchmarks that print figures (never timed assertions in tests).
//! One file per area; each area registers a variant here.

mod build;
mod launch;
mod migrate;
mod monitor;
mod resolve;
mod sbcast;
mod vm;

use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Image builds: warm-cache build vs mmdebstrap, no-op rebuild, boot overhead vs plain QEMU.
    Build(build::BuildBench),
    /// Launcher: agent bootstrap at scale, failure-detection latency.
    Launch(launch::LaunchBench),
    /// Migration: prediction to completed barrier-coordinated migration vs raw QEMU migration.
    Migrate(migrate::MigrateBench),
    /// Monitoring: sampler cost, controller ingest rate, rule evaluation, trigger latency.
    Monitor(monitor::MonitorBench),
    /// Resolver: parse + resolve time against the full Debian index, next to `apt-get install -s`.
    Resolve(resolve::ResolveBench),
    /// V2M: boot-to-ready vs plain QEMU, pause/resume latency, live migration, checkpoint/restore.
    Vm(vm::VmBench),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Build(a) => build::run(a),
        BenchCommand::Launch(a) => launch::run(a),
        BenchCommand::Migrate(a) => migrate::run(a),
        BenchCommand::Monitor(a) => monitor::run(a),
        BenchCommand::Resolve(a) => resolve::run(a),
        BenchCommand::Vm(a) => vm::run(a),
    }
}
