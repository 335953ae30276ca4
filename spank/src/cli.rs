//! Arguments of `vse spank PHASE`, as the C shim passes them. Values that users typed
//! (`--vse-vcpus` and friends) arrive as strings so that their errors name the Slurm option,
//! not this internal interface.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum Phase {
    /// srun/sbatch/salloc: check the request before anything starts.
    Check(RequestArgs),
    /// slurmstepd: the node's VM service of one step.
    Node(NodeArgs),
    /// A task: run its command in the node's VM and exit with its status.
    Task(TaskArgs),
    /// slurmstepd at step end: kill what is left of the step and remove its directory.
    Stop(StopArgs),
    /// Print files as JSON, read with the caller's privileges (the node service runs it as
    /// the job user to read what the user named).
    Read(ReadArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RequestArgs {
    /// `--vse`: an image directory (`vse build`) or a spec (`*.vse.yaml`).
    #[arg(long)]
    pub image: String,
    /// `--vse-policy`: comma-separated policies applied after the site's.
    #[arg(long)]
    pub policies: Option<String>,
    /// `--vse-vcpus`.
    #[arg(long)]
    pub vcpus: Option<String>,
    /// `--vse-memory` (MiB, or with a K/M/G/T suffix as Slurm's --mem).
    #[arg(long)]
    pub memory: Option<String>,
    /// `--vse-share`: comma-separated `HOST[:GUEST][:ro]`.
    #[arg(long)]
    pub shares: Option<String>,
    /// A plugstack.conf argument of vse_spank.so (`policy=`, `run_dir=`, `cache=`, `accel=`).
    #[arg(long = "plugin-arg", value_name = "KEY=VALUE")]
    pub plugin_args: Vec<String>,
    /// Relative paths of the request are relative to this directory.
    #[arg(long, default_value = "/")]
    pub cwd: PathBuf,
    /// The job (the node service's side): its partition, which picks the site's partition
    /// policy, is looked up from slurmctld, not taken from the job's environment.
    #[arg(long)]
    pub job: Option<u32>,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// The step's directory on this node (`<run_dir>/<job>.<step>.<node id>`).
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub uid: u32,
    #[arg(long)]
    pub gid: u32,
    /// The job's supplementary groups (comma-separated).
    #[arg(long, default_value = "")]
    pub groups: String,
    /// Tasks of the step on this node.
    #[arg(long, default_value_t = 1)]
    pub tasks: u32,
    #[arg(long, default_value_t = 1)]
    pub cpus_per_task: u32,
    /// Read end of a pipe whose write end only slurmstepd holds: end of file means the step
    /// is over (or slurmstepd died).
    #[arg(long)]
    pub lifeline_fd: Option<i32>,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    /// The step's directory on this node.
    #[arg(long)]
    pub dir: PathBuf,
    /// The task's command.
    #[arg(last = true, required = true, num_args = 1..)]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    #[arg(long)]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Largest file accepted, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_bytes: u64,
    pub files: Vec<PathBuf>,
}
