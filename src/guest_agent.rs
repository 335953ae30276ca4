//! The static guest agent built together with this `vse` (see `build.rs`), so that an
//! installed `vse` builds complete images with no second file to find.

use imgbuild::build::AgentBinary;
use std::path::PathBuf;

pub const EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vse-guest-agent"));

/// `--agent`/`VSE_GUEST_AGENT` when given (e.g. an agent under development), else ours.
pub fn choose(over: Option<PathBuf>) -> AgentBinary {
    over.map_or(AgentBinary::Embedded(EMBEDDED), AgentBinary::File)
}
