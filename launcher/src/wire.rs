//! What the agents of a launch say to each other over the overlay, by subsystem: the payload
//! of the agents' transport (`agents::proto::Msg<Wire>`). Staging has its own connections
//! and messages (`stage::wire`).

use agents::proto::{Held, NodeId, Payload};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Wire {
    Launch(LaunchMsg),
    Monitor(MonitorMsg),
    Barrier(BarrierMsg),
    Migrate(MigrateMsg),
    Checkpoint(CheckpointMsg),
}

impl Payload for Wire {
    /// Orders that start or move work on a node: only the front-end may give them.
    fn front_end_only(&self) -> bool {
        matches!(
            self,
            Wire::Launch(LaunchMsg::Stage | LaunchMsg::Vms { .. } | LaunchMsg::Stdin { .. })
                | Wire::Monitor(MonitorMsg::Start { .. })
                | Wire::Migrate(MigrateMsg::Out { .. })
                | Wire::Barrier(BarrierMsg::Down { .. } | BarrierMsg::DownClosed { .. })
                | Wire::Checkpoint(
                    CheckpointMsg::Pause { .. }
                        | CheckpointMsg::Save { .. }
                        | CheckpointMsg::Resume { .. }
                )
        )
    }

    /// While a node has no front-end: statuses, endpoints, barrier lines and migration
    /// results wait for the next one; output waits while there is room; answers to a
    /// sampling, staging or checkpoint order of the lost front-end are of no use to the next.
    fn held(&self) -> Held {
        match self {
            Wire::Launch(LaunchMsg::RankOutput { .. }) => Held::Bounded,
            Wire::Monitor(_)
            | Wire::Checkpoint(_)
            | Wire::Launch(
                LaunchMsg::StageListening { .. }
                | LaunchMsg::StageRefused { .. }
                | LaunchMsg::StdinTaken { .. },
            ) => Held::Drop,
            _ => Held::Keep,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One VM a node must start: its rank and the host CPUs its vCPUs are pinned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmOrder {
    pub rank: u32,
    pub cpus: Vec<usize>,
    /// Start the VM from this checkpoint instead of booting it (`vse launch --restore`).
    #[serde(default)]
    pub restore: Option<RestoreVm>,
}

/// A VM's saved state and disk (files of a verified checkpoint, visible on the node) and the
/// rank's running command to adopt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreVm {
    pub state: PathBuf,
    pub disk: PathBuf,
    /// SHA256 of the disk: the node checks its copy.
    pub disk_sha256: String,
    pub exec_id: u64,
    pub first_id: u64,
    /// Lines for ranks of the VM that were saved waiting at a barrier, sent to each guest
    /// connection once the command is adopted: the restored ranks go on from the barrier.
    #[serde(default)]
    pub barrier_lines: Vec<(u64, String)>,
}

/// Booting the job's VMs and running its ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LaunchMsg {
    /// Front-end to a node: open a staging listener for this job's image.
    Stage,
    /// Node to the front-end: where its staging listener is.
    StageListening { addr: SocketAddr },
    /// Node to the front-end: it cannot stage (e.g. its image cache is not private).
    StageRefused { reason: String },
    /// Front-end to a node: boot these VMs from the staged image and run `argv` in each.
    Vms {
        digest: String,
        /// Total number of ranks (VMs) in the job.
        size: u32,
        /// Every VM's name on its node, by rank.
        hosts: Vec<String>,
        /// Every guest's hostname, by rank (`VSE_HOSTS`, the guests' hosts files).
        hostnames: Vec<String>,
        argv: Vec<String>,
        vms: Vec<VmOrder>,
        memory_mib: u64,
        /// `None`: each node's first available hypervisor.
        hypervisor: Option<v2m::PluginKind>,
        /// The job's private VM network, if it has one.
        net: Option<crate::net::JobNet>,
        /// Run `argv` under mpirun in rank 0's VM; the other VMs only host MPI processes.
        mpi: bool,
        /// Pin each VM to its planned cores (see `JobPlan::pin`).
        pin: bool,
        /// Start VMs from the node's boot template of the image and profile, saving one
        /// after a cold boot when there is none (see `vmhost::template`).
        #[serde(default)]
        boot_templates: bool,
        /// Run the command (and MPI's processes) as the guest's root, not as the job's user.
        #[serde(default)]
        guest_root: bool,
        /// Rank 0's command reads the front-end's standard input ([`LaunchMsg::Stdin`]).
        #[serde(default)]
        stdin: bool,
        /// Host directories every VM mounts (resolved by the front-end, as the user).
        #[serde(default)]
        shares: Vec<vse_guest_agent::share::server::Shared>,
        /// Where the command starts in the guest (the launch directory, when shared).
        #[serde(default)]
        cwd: Option<String>,
        /// The bounds of the node's image cache, kept once this job's image is taken.
        #[serde(default)]
        cache: vse_base::evict::Limits,
    },
    /// Front-end to the node holding `vm`: its command's standard input from byte `offset`
    /// (`data` in hex), `eof` ending it. Sent again, to the VM's node of then, until taken.
    Stdin {
        vm: String,
        offset: u64,
        data: String,
        eof: bool,
    },
    /// Node to the front-end: rank `rank`'s guest has written its input up to `upto`.
    StdinTaken { rank: u32, upto: u64 },
    /// Node to the front-end: the relay of rank `rank`'s NIC (its address and session), for
    /// the job's switch to admit (sent before the VM starts, or after it moved here).
    VmEndpoint {
        rank: u32,
        addr: SocketAddr,
        session: u64,
    },
    /// Node to the front-end: output of one rank's command.
    RankOutput {
        rank: u32,
        stream: Stream,
        data: String,
    },
    /// Node to the front-end: one rank is done; `error` when its VM could not run the command.
    RankExited {
        rank: u32,
        code: i32,
        error: Option<String>,
        /// Where the rank's time went on its node (absent from a node that does not say).
        #[serde(default)]
        times: Option<RankTimes>,
    },
}

/// One rank's time on its node, in milliseconds, phase by phase: the launch report's answer
/// to "where did the time go" below the front-end's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTimes {
    /// The order's arrival to the hypervisor running the guest: disk overlay, process start,
    /// control socket, pinning (or, restored, the state loaded).
    pub vm_start_ms: u64,
    /// From there to the guest agent answering: the guest's kernel and init.
    pub guest_ms: u64,
    /// The rank's command, from its start (job network set up first) to its exit.
    pub run_ms: u64,
    /// Stopping the VM and removing its overlay.
    pub stop_ms: u64,
    /// How the VM came to run: from its kernel (`cold`, `saved-template` when its state then
    /// became the node's boot template), `from-template`, or `restored` from a checkpoint.
    pub boot: RankBoot,
}

/// How a rank's VM came to run (the launch report's `times.boot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RankBoot {
    Cold,
    SavedTemplate,
    FromTemplate,
    Restored,
}

impl From<vmhost::BootKind> for RankBoot {
    fn from(k: vmhost::BootKind) -> Self {
        match k {
            vmhost::BootKind::Cold => RankBoot::Cold,
            vmhost::BootKind::SavedTemplate => RankBoot::SavedTemplate,
            vmhost::BootKind::FromTemplate => RankBoot::FromTemplate,
        }
    }
}

/// Sampling nodes and VMs for the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MonitorMsg {
    /// Front-end to a node (root role): sample this node every `period_ms` and send the
    /// samples up; `node_memory_mib` puts the node's VMs in a memory cgroup of that size whose
    /// view replaces `/proc/meminfo` (simulation mode: nodes sharing one machine).
    Start {
        job: String,
        node: String,
        period_ms: u64,
        node_memory_mib: Option<u64>,
    },
    /// Node to the front-end: one sampling round (the node, then each of its VMs).
    Samples { samples: Vec<monitor::Sample> },
    /// Node to the front-end: the node cannot monitor itself as asked.
    Failed { reason: String },
}

/// A guest rank's barrier connection, relayed between the node holding its VM and the
/// controller (`conn` is the guest agent's id, stable across migrations of `vm`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BarrierMsg {
    /// Node to the front-end: a line from the rank.
    Up { vm: String, conn: u64, line: String },
    /// Node to the front-end: the rank closed its connection.
    UpClosed { vm: String, conn: u64 },
    /// Front-end to the node holding `vm`: a line for the rank.
    Down { vm: String, conn: u64, line: String },
    /// Front-end to the node holding `vm`: the controller closed the rank's connection.
    DownClosed { vm: String, conn: u64 },
}

/// A guest rank's barrier connection: the guest agent's connection id and the rank it
/// said it is (its `HELLO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierConn {
    pub conn: u64,
    pub rank: u32,
}

/// Moving a VM between nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MigrateMsg {
    /// Front-end to the source node: live-migrate `vm` to node `dest` within `params` (the
    /// policy's migration limits). With `hold`, only have the destination prepare, and send
    /// the state when the front-end's `Release` says go: the incoming VM starts while the
    /// ranks make their way to a barrier.
    Out {
        vm: String,
        dest: NodeId,
        params: v2m::MigrationParams,
        #[serde(default)]
        hold: bool,
    },
    /// Front-end to the source node holding a prepared move of `vm`: send it now (`go`), or
    /// give it up (the destination drops its incoming VM; `vm` stays).
    Release { vm: String, go: bool },
    /// Source to destination node: prepare `vm` (as `profile` describes it) to receive the
    /// state; the rank's command is guest agent request `exec_id`, and a new guest agent link
    /// must use request ids from `first_id` on.
    In {
        vm: String,
        rank: u32,
        profile: Box<v2m::Profile>,
        exec_id: u64,
        first_id: u64,
        /// The job's switch, when the VM has a NIC: the destination opens its own relay.
        switch: Option<SocketAddr>,
        /// The staged image's digest: the destination boots on its own copy of it (from its
        /// node-local cache), never on the paths in `profile`.
        #[serde(default)]
        digest: Option<String>,
        /// The source's token next to the VM's disk overlay: a destination that reads it at
        /// the same path shares the source's storage and opens the overlay in place;
        /// otherwise the overlay is copied.
        #[serde(default)]
        probe: Option<vmhost::StorageProbe>,
        /// The guest's shares: the destination serves them from the moment it takes over.
        #[serde(default)]
        shares: Vec<vse_guest_agent::share::server::Shared>,
    },
    /// Destination to source node: the prepared VM listens here; its disks are to be
    /// mirrored to the NBD export `disks` names (on `addr`'s host), or opened in place.
    Listening {
        vm: String,
        addr: SocketAddr,
        #[serde(default)]
        disks: v2m::DiskMigration,
    },
    /// Source to destination node: the state was sent (`ok`, with what the source measured)
    /// or the migration failed and the prepared VM must go.
    Sent {
        vm: String,
        ok: bool,
        #[serde(default)]
        report: Option<v2m::MigrationReport>,
        /// The start of a guest agent line the switchover cut (hex): the source's host end
        /// read it, the destination's gets the rest.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        cut: String,
    },
    /// To the front-end, from the destination (it runs the VM and owns its rank now, and
    /// says what the move carried) or from the source (`error`: the VM still runs there).
    Done {
        vm: String,
        rank: u32,
        error: Option<String>,
        #[serde(default)]
        transfer: Option<control::state::Transfer>,
    },
}

/// A job checkpoint: every VM paused before any is saved (the consistent point), then saved
/// into the checkpoint's directory, then resumed (or left for the teardown when the job stops).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CheckpointMsg {
    /// Front-end to a node: pause every VM of the job here.
    Pause { id: u64 },
    /// Node to the front-end: these ranks' VMs are paused (`error`: not all could be; those
    /// that were run on).
    Paused {
        id: u64,
        ranks: Vec<u32>,
        error: Option<String>,
    },
    /// Front-end to a node: save each paused VM into `dir` (shared with the front-end).
    /// With `last`, the job stops after it: the ranks' output still on its way from the
    /// paused guests must arrive before the answer does.
    Save { id: u64, dir: PathBuf, last: bool },
    /// Node to the front-end: what it saved, or why it could not.
    Saved {
        id: u64,
        vms: Vec<crate::ckpt::SavedVm>,
        error: Option<String>,
    },
    /// Front-end to a node: the checkpoint is over; run the VMs on.
    Resume { id: u64 },
}
