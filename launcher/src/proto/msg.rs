//! Control messages exchanged by agents.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Position of an agent in the job: 0 is the front-end, 1..=N the node agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "agent{}", self.0)
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
}

/// What staging did on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum StageOutcome {
    /// Received, verified chunk by chunk and as a whole, renamed into the cache.
    Staged,
    /// The cache already held this digest: nothing was sent.
    Cached,
    Failed {
        reason: String,
    },
}

// Not `Eq`: samples carry fractions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// First frame on a connection: who is calling and where it listens.
    Hello {
        id: NodeId,
        listen: SocketAddr,
    },
    /// Answer to Hello: the callee's identity.
    Welcome {
        id: NodeId,
    },
    /// Child to parent once its own subtree has bootstrapped (or failed to).
    SubtreeReady {
        up: Vec<(NodeId, SocketAddr)>,
        failed: Vec<NodeId>,
    },
    /// Front-end down the tree: every live agent's address, so overlay links can be made.
    Directory {
        addrs: Vec<(NodeId, SocketAddr)>,
    },
    /// An agent's overlay links are up.
    OverlayReady {
        id: NodeId,
    },
    Ping {
        seq: u64,
    },
    Pong {
        seq: u64,
    },
    /// Flooded over the overlay: `node` is dead, as seen by `by`.
    Failed {
        node: NodeId,
        by: NodeId,
        reason: String,
    },
    /// Unicast over the overlay's routing tables.
    Routed {
        src: NodeId,
        dst: NodeId,
        hops: u8,
        inner: Box<Msg>,
    },
    /// Front-end to a node: run a command (session agent acts for the user).
    Exec {
        argv: Vec<String>,
        env: Vec<(String, String)>,
    },
    Output {
        from: NodeId,
        stream: Stream,
        data: Vec<u8>,
    },
    Exited {
        from: NodeId,
        code: i32,
    },
    /// One chunk of an image being staged; data travels in the frame's blob.
    Chunk {
        digest: String,
        index: u64,
        count: u64,
        size: u64,
        sha256: String,
    },
    /// Staging, first frame from a sender: the image, and where every node of the job's tree
    /// listens for it (so a node can take over the children of a dead one).
    StageOffer {
        digest: String,
        files: Vec<(String, u64)>,
        chunk_size: u64,
        k: u32,
        nodes: Vec<(NodeId, SocketAddr)>,
    },
    /// Answer to an offer, then every chunk's acknowledgement and the receiver's heartbeat:
    /// chunks `0..next` are on disk and verified; `complete` once the image is in the cache.
    StageHave {
        next: u64,
        complete: bool,
    },
    /// A receiver's whole subtree is done: every node staged (or found it cached) or failed.
    StageReport {
        nodes: Vec<(NodeId, StageOutcome)>,
    },
    /// Front-end to a node: open a staging listener for this job's image.
    LaunchStage,
    /// Node to the front-end: where its staging listener is.
    StageListening {
        addr: SocketAddr,
    },
    /// Front-end to a node: boot these VMs from the staged image and run `argv` in each.
    LaunchVms {
        digest: String,
        /// Total number of ranks (VMs) in the job.
        size: u32,
        /// Every VM's name, by rank (`VSE_HOSTS`).
        hosts: Vec<String>,
        argv: Vec<String>,
        vms: Vec<VmOrder>,
        memory_mib: u64,
        hypervisor: String,
        /// The job's private VM network, if it has one.
        net: Option<crate::net::JobNet>,
        /// Run `argv` under mpirun in rank 0's VM; the other VMs only host MPI processes.
        mpi: bool,
    },
    /// Node to the front-end: the UDP endpoint rank `rank`'s NIC sends from, for the job's
    /// switch to admit (sent before the VM starts).
    VmEndpoint {
        rank: u32,
        addr: SocketAddr,
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
    },
    /// Flooded: terminate everything and exit.
    Shutdown {
        reason: String,
    },
    /// Front-end to a node (root role): sample this node every `period_ms` and send the
    /// samples up as [`Msg::Samples`]; `node_memory_mib` puts the node's VMs in a memory
    /// cgroup of that size whose view replaces `/proc/meminfo` (simulation mode, `local:N`).
    MonitorStart {
        job: String,
        node: String,
        period_ms: u64,
        node_memory_mib: Option<u64>,
    },
    /// Node to the front-end: one sampling round (the node, then each of its VMs).
    Samples {
        samples: Vec<crate::monitor::Sample>,
    },
    /// Node to the front-end: the node cannot monitor itself as asked.
    MonitorFailed {
        reason: String,
    },
    /// Node to the front-end: a line from a guest rank's barrier connection (`conn` is the
    /// guest agent's id, stable across migrations of `vm`).
    BarrierUp {
        vm: String,
        conn: u64,
        line: String,
    },
    /// Node to the front-end: the guest rank closed its barrier connection.
    BarrierUpClosed {
        vm: String,
        conn: u64,
    },
    /// Front-end to the node holding `vm`: a line for a guest rank's barrier connection.
    BarrierDown {
        vm: String,
        conn: u64,
        line: String,
    },
    /// Front-end to the node holding `vm`: the controller closed the rank's connection.
    BarrierDownClosed {
        vm: String,
        conn: u64,
    },
    /// Front-end to the source node: live-migrate `vm` to node `dest` within `params` (the
    /// policy's migration limits).
    MigrateOut {
        vm: String,
        dest: NodeId,
        params: v2m::MigrationParams,
    },
    /// Source to destination node: prepare `vm` (as `profile` describes it) to receive the
    /// state; the rank's command is guest agent request `exec_id`, and a new guest agent link
    /// must use request ids from `first_id` on.
    MigrateIn {
        vm: String,
        rank: u32,
        profile: Box<v2m::Profile>,
        exec_id: u64,
        first_id: u64,
    },
    /// Destination to source node: the prepared VM listens here.
    MigrateListening {
        vm: String,
        addr: SocketAddr,
    },
    /// Source to destination node: the state was sent (`ok`) or the migration failed and the
    /// prepared VM must go.
    MigrateSent {
        vm: String,
        ok: bool,
    },
    /// To the front-end, from the destination (it runs the VM and owns its rank now) or from
    /// the source (`error`: the VM still runs there).
    MigrateDone {
        vm: String,
        rank: u32,
        error: Option<String>,
    },
}
