//! The launcher: allocation sources, the agent runtime (roles, k-ary tree bootstrap, BMG overlay,
//! failure detection), authenticated wire protocol and pipelined image staging (seed 003 §3).

pub mod fleet;
pub mod launch;
pub mod net;
pub mod stage;
mod sync;
pub mod wire;
