//! The launcher: the `vse launch` job over the agents — agent configuration ([`job`]), the wire
//! messages ([`wire`]), pipelined image staging ([`stage`]), the job network ([`net`]), the
//! front-end ([`launch`]), each node's side of the job ([`node`]) and the migration daemon's
//! VMs on one machine ([`fleet`]).

pub mod ckpt;
pub mod fleet;
pub mod job;
pub mod launch;
pub mod net;
pub mod node;
pub mod stage;
mod sync;
pub mod wire;
