//! The Rust side of the Slurm SPANK plugin (`plugins/spank/vse_spank.c`), which gives Slurm
//! `srun --vse=IMAGE|SPEC [--vse-policy P[,P…]] [--vse-vcpus N] [--vse-memory M]
//! [--vse-share S[,…]] CMD`.
//!
//! The C shim only registers the options and calls `vse spank PHASE`:
//!
//! - [`check`] (srun, sbatch, salloc; the user's privileges): the request against the site's
//!   policies, so a bad `--vse` fails the command before anything starts.
//! - [`node::serve`] (slurmstepd, root): one service per step and node. It checks the request
//!   again (authoritatively), builds a spec into the node-local cache, boots **one VM per
//!   node** that holds all of the node's tasks, and runs their commands through the VM's
//!   guest agent. One VM per node rather than per task: a node's tasks share memory and
//!   cores the way they would on the bare node, and a step pays for one boot per node.
//! - [`task::run`] (each task, the job user, exec'd from `slurm_spank_task_init`): sends the
//!   task's argv, environment (with Slurm's rank variables) and working directory to the
//!   node's service, prints the output as it comes and exits with the command's status.
//! - [`stop::stop`] (slurmstepd at step end, root; also after scancel or a time limit): kills
//!   whatever of the step is left and removes its directory.
//!
//! Where the VM comes from is the binary's business ([`node::Host`]): booting and building
//! live there, and this crate calls them rather than copying them.

mod audit;
mod cgroup;
pub mod cli;
pub mod node;
pub mod proto;
pub mod request;
pub mod shares;
pub mod stop;
pub mod task;
mod user;

pub use cli::{NodeArgs, Phase, ReadArgs, RequestArgs, StopArgs, TaskArgs};
pub use request::{Accel, Checked, PluginConf, Source, check};
pub use user::read_here;

#[derive(Debug, thiserror::Error)]
pub enum SpankError {
    /// The request (the user's options) or the plugin's configuration is wrong: exit code 2.
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The node's VM service could not do what was asked (boot, build, guest agent).
    #[error("{0}")]
    Node(String),
}

impl SpankError {
    pub fn is_invalid(&self) -> bool {
        matches!(self, SpankError::Invalid(_))
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SpankError {
        let what = what.into();
        move |source| SpankError::Io { what, source }
    }
}
