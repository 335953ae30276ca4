//! Where the job's nodes come from: Slurm, PBS/Torque, a host file, or this machine.

mod hostlist;
mod route;
mod sources;

pub use hostlist::{HostlistError, MAX_HOSTS, expand as expand_hostlist};
pub use route::{NoRoute, source_address_to};
pub use sources::{AllocError, Allocation, AllocationSource, Launcher, NodeSlot};
