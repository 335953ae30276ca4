//! Progress reporting: the library emits events, the CLI draws them (indicatif or lines).

/// A build step, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    Fetch,
    Unpack,
    Configure,
    Customize,
    Initramfs,
    RootDisk,
    Extras,
    /// `vse import`: reading the source and checking its digests.
    Verify,
    /// `vse import`: unpacking the image's layers.
    Layers,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Fetch => "fetching packages",
            Phase::Unpack => "unpacking packages",
            Phase::Configure => "configuring (maintainer scripts)",
            Phase::Customize => "applying spec and policy",
            Phase::Initramfs => "generating initramfs",
            Phase::RootDisk => "writing root disk",
            Phase::Extras => "writing extra formats",
            Phase::Verify => "reading and verifying the image",
            Phase::Layers => "unpacking image layers",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Event {
    Phase(Phase),
    FetchStart {
        files: usize,
        bytes: u64,
    },
    FetchFile {
        name: String,
        bytes: u64,
        cached: bool,
    },
    FetchDone,
    Unpacked {
        name: String,
    },
    /// A line of output from a maintainer script or post-install command.
    ScriptOutput(String),
}

pub trait Progress: Sync {
    fn event(&self, ev: Event);
}

/// Discards everything (tests, `--quiet`).
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _ev: Event) {}
}
