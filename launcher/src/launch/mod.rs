//! `vse launch` logic that needs no VM: which VM gets which rank and which host cores, how
//! rank output is prefixed, and how rank statuses make the job's exit code. The front-end and
//! the node agents (in the `vse` binary) drive V2M with it.

mod control;
mod front;
mod migrator;
mod mpi;
mod output;
mod plan;
mod relay;

pub use control::{
    ControlError, ControlOptions, ControlSummary, Controller, JobLayout, MigrationSetup,
};
pub use front::{
    LaunchEvent, LaunchReport, LaunchRequest, MonitorRequest, RankResult, launch_blocking,
};
pub use migrator::OverlayMigrator;
pub use mpi::{HOSTFILE, RSH_AGENT, hostfile, mpirun_command};
pub use output::LinePrefixer;
pub use plan::{LaunchError, NodeCpus, VmSlot, job_status, plan_ranks, vm_name};
pub use relay::{BarrierHub, Owners};

/// Exit codes of `vse launch` for failures of the infrastructure rather than of the job
/// (the job's own statuses are 0..=255 from its ranks; these sit above the usual shell range
/// of a command's failures and below 126/127/128+n).
pub mod exit_code {
    /// An agent or node failed (bootstrap, heartbeat, connection), so the job was torn down.
    pub const AGENT_FAILURE: u8 = 101;
    /// The image could not be staged to every node.
    pub const STAGING_FAILURE: u8 = 102;
    /// A VM could not be booted or did not run the command (no exit status exists).
    pub const VM_FAILURE: u8 = 103;
}
