//! `vse bench …`: benchmarks that print figures (never timed assertions in tests).
//! One file per area; each area registers a variant here.

use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {}
}
