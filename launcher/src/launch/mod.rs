//! `vse launch` logic that needs no VM: which VM gets which rank and which host cores, how
//! rank output is prefixed, and how rank statuses make the job's exit code. The front-end and
//! the node agents (`crate::node`) drive V2M with it.

mod attach;
mod audit;
mod checkpoint;
mod control;
mod front;
mod input;
mod migrator;
mod mpi;
mod output;
mod plan;
mod reattach;
mod relay;
mod request;
mod restore;
mod run;
mod sweep;
mod wake;

pub use attach::record_path;
pub use checkpoint::{CheckpointPlan, Taken};
pub use control::{
    ControlError, ControlOptions, ControlSummary, Controller, JobLayout, MigrationSetup,
};
pub use front::{
    Hostnames, LaunchEvent, LaunchReport, LaunchRequest, Mark, MonitorRequest, RankResult,
    launch_blocking,
};
pub use migrator::{OverlayMigrateError, OverlayMigrator};
pub use mpi::{HOLD, HOSTFILE, RSH_AGENT, hostfile, mpirun_command};
pub use output::LinePrefixer;
pub use plan::{LaunchError, NodeCpus, VmSlot, job_status, plan_ranks, vm_name};
pub use reattach::attach_blocking;
pub use relay::{BarrierHub, Owners};
pub use request::{RequestError, Sizes, check_job_memory, check_request, hypervisor_and_migration};
