//! `vse bench …`: benchmarks that print figures (never timed assertions in tests).
//! One file per area; each area registers a variant here.

mod monitor;
mod vm;

use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Monitoring: sampler cost, controller ingest rate, rule evaluation, trigger latency.
    Monitor(monitor::MonitorBench),
    /// V2M: boot-to-ready vs plain QEMU, pause/resume latency, live migration, checkpoint/restore.
    Vm(vm::VmBench),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Monitor(a) => monitor::run(a),
        BenchCommand::Vm(a) => vm::run(a),
    }
}
