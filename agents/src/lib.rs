//! The agents of a job: allocation sources, the authenticated wire protocol, the k-ary tree
//! bootstrap, the binomial-graph overlay and failure detection (seed 003 §3).
//!
//! This crate is the transport. What the agents say to each other on behalf of an application
//! (a launch, staging, monitoring, migration) is the application's own message type, carried
//! as the payload `A` of [`proto::Msg`]; nothing here knows it.

pub mod agent;
pub mod alloc;
#[cfg(feature = "sim")]
pub mod bench;
pub mod proto;
pub mod secret;
#[cfg(feature = "sim")]
mod sync;
pub mod topo;
