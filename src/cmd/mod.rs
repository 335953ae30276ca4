//! Subcommands: one file each. Register a new one in [`Command`] and [`run`].

mod agent;
mod attach;
mod audit;
mod bench;
mod build;
mod check;
mod checkpoint;
mod envload;
mod evacuate;
#[cfg(test)]
mod hints;
mod import;
mod launch;
mod launch_admit;
mod launch_ckpt;
mod lock;
mod owner;
mod request;
pub(crate) mod run;
mod shares;
mod sign;
mod site;
mod spank;
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
    after_help = format!("{}\n\n{}", vse_exit::Exit::help_table(), crate::environment::help())
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The audit trail: admissions and refusals of builds, launches, migrations, … by job and user.
    Audit(audit::AuditArgs),
    /// Take over a running job whose `vse launch` died: its output, exit status, monitoring.
    Attach(attach::AttachArgs),
    /// Agent process started by `vse launch` on every node (internal).
    #[command(hide = true)]
    Agent(agent::AgentArgs),
    /// Benchmarks: print speed and memory figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Build a bootable image from a lockfile (and the spec it names).
    Build(build::BuildArgs),
    /// The user-namespace helper of a build by an ordinary user (internal).
    #[command(hide = true, name = imgbuild::rootless::CHILD_COMMAND)]
    BuildInUserns,
    /// Validate a spec against policies and print the effective environment.
    Check(check::CheckArgs),
    /// Checkpoint a running job now (launched with --checkpoint-dir); it runs on.
    Checkpoint(checkpoint::CheckpointArgs),
    /// Move every VM of a running job off a node (drain, maintenance) and mark it defunct.
    Evacuate(evacuate::EvacuateArgs),
    /// Make an image from an OCI/Docker image or a rootfs tarball (same layout as `build`).
    Import(import::ImportArgs),
    /// Inside an allocation: boot VMs on every node, run a command in each (one rank per VM).
    Launch(launch::LaunchArgs),
    /// Resolve a spec's packages against the Debian repositories into a lockfile.
    Lock(lock::LockArgs),
    /// Boot an image and run one command in it through the guest agent; exits with its status.
    Run(run::RunArgs),
    /// Sign an image's manifest with a site key (for `images.signed_by`).
    Sign(sign::SignArgs),
    /// What the Slurm SPANK plugin (`srun --vse=…`) calls on each side (internal).
    #[command(hide = true, subcommand)]
    Spank(vse_spank::Phase),
    /// Nodes, pools, VM placement, latest samples and migrations from the controller's state.
    Status(status::StatusArgs),
    /// VMs through V2M (admin/debugging): start, stop, pause, resume, status, migrate, checkpoint, restore, explain.
    Vm(vm::VmArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(a) => agent::run(a),
        Command::Attach(a) => attach::run(a),
        Command::Audit(a) => {
            vse_base::pipe::end_quietly_when_stdout_closes();
            audit::run(a)
        }
        Command::Bench(cmd) => bench::run(cmd),
        Command::Build(a) => build::run(a),
        Command::BuildInUserns => Ok(build::in_userns()),
        Command::Check(a) => {
            vse_base::pipe::end_quietly_when_stdout_closes();
            check::run(a)
        }
        Command::Checkpoint(a) => checkpoint::run(a),
        Command::Import(a) => import::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Lock(a) => lock::run(a),
        Command::Run(a) => run::run(a),
        Command::Sign(a) => sign::run(a),
        Command::Spank(p) => spank::run(p),
        Command::Evacuate(a) => evacuate::run(a),
        Command::Status(a) => status::run(a),
        Command::Vm(a) => vm::run(a),
    }
}
