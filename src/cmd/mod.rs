//! Subcommands: one file each. Register a new one in [`Command`] and [`run`].

mod agent;
mod bench;
mod build;
mod check;
mod envload;
mod launch;
mod lock;
mod run;
mod status;
mod vm;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "vse",
    version,
    about = "Virtual system environments for HPC: run batch jobs inside VMs built from a declarative spec",
    propagate_version = true,
    after_help = "Exit codes: 0 ok, 1 internal error, 2 invalid input, 3 out of date (`lock --check`); commands that run a job return its status."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Agent process started by `vse launch` on every node (internal).
    #[command(hide = true)]
    Agent(agent::AgentArgs),
    /// Benchmarks: print speed and memory figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Build a bootable image from a lockfile (and the spec it names).
    Build(build::BuildArgs),
    /// Validate a spec against policies and print the effective environment.
    Check(check::CheckArgs),
    /// Inside an allocation: boot VMs on every node, run a command in each (one rank per VM).
    Launch(launch::LaunchArgs),
    /// Resolve a spec's packages against the Debian repositories into a lockfile.
    Lock(lock::LockArgs),
    /// Boot an image and run one command in it through the guest agent; exits with its status.
    Run(run::RunArgs),
    /// Nodes, pools, VM placement, latest samples and migrations from the controller's state.
    Status(status::StatusArgs),
    /// VMs through V2M (admin/debugging): start, stop, pause, resume, status, migrate, checkpoint, restore, explain.
    Vm(vm::VmArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(a) => agent::run(a),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Build(a) => build::run(a),
        Command::Check(a) => check::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Lock(a) => lock::run(a),
        Command::Run(a) => run::run(a),
        Command::Status(a) => status::run(a),
        Command::Vm(a) => vm::run(a),
    }
}
