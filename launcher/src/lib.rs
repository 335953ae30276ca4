//! The launcher: allocation sources, the agent runtime (roles, k-ary tree bootstrap, BMG overlay,
//! failure detection), authenticated wire protocol and pipelined image staging (seed 003 §3).

pub mod agent;
pub mod alloc;
pub mod bench;
pub mod controller;
pub mod launch;
pub mod migrate;
pub mod monitor;
pub mod net;
pub mod proto;
pub mod secret;
pub mod stage;
mod sync;
pub mod topo;
