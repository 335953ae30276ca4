//! vsec: the VSE compiler. Spec and policy parsing, their merge into an effective
//! environment, Debian package resolution, and the lockfile.

pub mod admit;
pub mod deb;
pub mod env;
pub mod fields;
pub mod index;
pub mod launch;
pub mod lock;
pub mod merge;
pub mod policy;
pub mod repo;
pub mod resolve;
pub mod shares;
pub mod site;
pub mod solve;
pub mod spec;
pub mod units;
pub mod yaml;

#[cfg(test)]
mod walk;
