//! What a job checkpoint is made of: `checkpoint.json`, written last, names every file of
//! the checkpoint with its size and SHA256 and says how to put the job back together (the
//! image, the rank layout, the job network, each rank's running command).

use serde::{Deserialize, Serialize};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST: &str = "checkpoint.json";

/// Bumped whenever a field changes meaning: an older vse refuses a newer checkpoint.
pub const FORMAT: u32 = 2;

/// Why a checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The allocation's walltime is about to end.
    WalltimeEnd,
    /// The spec's `checkpoint.interval` passed.
    Periodic,
    /// The batch system asked the job to end (preemption, requeue, `scancel`).
    Preempted,
    /// `vse checkpoint --job ID`.
    Requested,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::WalltimeEnd => "walltime-end",
            Reason::Periodic => "periodic",
            Reason::Preempted => "preempted",
            Reason::Requested => "requested",
        }
    }

    /// Whether the job stops once the checkpoint is complete (else it runs on).
    pub fn stops(self) -> bool {
        matches!(self, Reason::WalltimeEnd | Reason::Preempted)
    }
}

/// How the job's VMs were brought to one consistent point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cut {
    /// Every VM paused before any was saved: a consistent cut as long as the guests' own
    /// transport (TCP) resends what was in flight.
    #[default]
    Pause,
    /// Every MPI rank waited at an `MPI_Barrier` for `notice` first, then every VM paused:
    /// no application message is in flight. A restore releases the ranks from the barrier.
    Barrier { notice: i64 },
}

impl Cut {
    pub fn describe(self) -> &'static str {
        match self {
            Cut::Pause => "VMs paused",
            Cut::Barrier { .. } => "ranks at a barrier",
        }
    }
}

/// One file of a checkpoint, named relative to the checkpoint's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
}

/// One rank at the checkpoint: its VM's saved state, or how it had ended already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRecord {
    pub rank: u32,
    pub vm: String,
    /// The node (agent number) it ran on; a restore may place it elsewhere.
    pub node: u32,
    pub vcpus: u32,
    /// `Some`: the rank's command had ended with this status; nothing of it is saved.
    pub status: Option<i32>,
    pub saved: Option<SavedVm>,
}

/// A VM's part of a checkpoint, as its node saved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedVm {
    pub rank: u32,
    pub vm: String,
    /// The rank's command: the guest agent request a new link adopts after the restore.
    pub exec_id: u64,
    /// A new guest agent link uses request ids from here on (above every id the old used).
    pub first_id: u64,
    /// The VM's memory and device state (QEMU's migration stream).
    pub state: FileRecord,
    /// Its disk overlay (qcow2 over the image's root), as it was while the VM was paused.
    pub disk: FileRecord,
    /// Its ranks' barrier connections: the restore's barrier server hears of them.
    #[serde(default)]
    pub barrier: Vec<crate::wire::BarrierConn>,
}

/// The manifest of one complete checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Numbered from 1 within its checkpoint directory; the highest complete one is the latest.
    pub seq: u64,
    pub job: String,
    pub reason: Reason,
    /// Milliseconds since the epoch when every VM was paused (the consistent point).
    pub taken_ms: u64,
    /// How long taking it kept the job paused.
    pub duration_ms: u64,
    #[serde(default)]
    pub cut: Cut,
    /// The staged image's digest: a restore must stage the same image.
    pub image_digest: String,
    pub argv: Vec<String>,
    pub mpi: bool,
    pub memory_mib: u64,
    /// Every VM's guest hostname, by rank (the guests' hosts files name them).
    pub hostnames: Vec<String>,
    /// The job network's segment (`None`: the VMs have no NIC).
    pub network: Option<(std::net::Ipv4Addr, u8)>,
    /// The guests' shares, in mount order (the guests hold them by position), and where
    /// the command started: a restore serves the same directories at the same places.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<vse_guest_agent::share::server::Shared>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub ranks: Vec<RankRecord>,
}

impl Manifest {
    /// Every file the checkpoint holds besides the manifest.
    pub fn files(&self) -> impl Iterator<Item = &FileRecord> {
        self.ranks
            .iter()
            .filter_map(|r| r.saved.as_ref())
            .flat_map(|s| [&s.state, &s.disk])
    }

    pub fn bytes(&self) -> u64 {
        self.files().map(|f| f.bytes).sum()
    }
}
