//! Subcommands: one file each. Register a new one in [`Command`] and [`run`].

mod bench;
mod check;
mod status;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "vse",
    version,
    about = "Virtual system environments for HPC: run batch jobs inside VMs built from a declarative spec",
    propagate_version = true,
    after_help = "Exit codes: 0 ok, 1 internal error, 2 invalid input; commands that run a job return its status."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Benchmarks: print speed and memory figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Validate a spec against policies and print the effective environment.
    Check(check::CheckArgs),
    /// Nodes, pools, VM placement, latest samples and migrations from the controller's state.
    Status(status::StatusArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Bench(cmd) => bench::run(cmd),
        Command::Check(a) => check::run(a),
        Command::Status(a) => status::run(a),
    }
}
