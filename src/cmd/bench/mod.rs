//! `vse bench …`: benchmarks that print figures (never timed assertions in tests).
//! One file per area; each area registers a variant here.

mod monitor;

use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Monitoring: sampler cost, controller ingest rate, rule evaluation, trigger latency.
    Monitor(monitor::MonitorBench),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Monitor(a) => monitor::run(a),
    }
}
