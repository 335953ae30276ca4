//! The package solver: I/O-free, behind the [`Provider`] trait, so it is tested on small
//! synthetic repositories and run on the full Debian index alike.
//!
//! Why not `resolvo`: its model is one version per package name with version-set
//! requirements and "constrains". Debian needs requirements satisfiable by *other* names
//! (Provides, versioned Provides, alternatives across names) and negative relations against
//! virtual names (Conflicts/Breaks on a provided name). Encoding those means synthesising a
//! variable per (virtual name, provider) and losing apt's preference order, which is what
//! keeps our closures the size of apt's. So this is a purpose-built backtracking search:
//!
//! - depth-first over unsatisfied dependency groups, in apt's order (a package's
//!   Pre-Depends and Depends right after it is chosen);
//! - the options for a group, in apt's preference: alternatives left to right, real
//!   packages before providers, highest version first, providers by priority;
//! - every choice is a choice point; a dead end (no option left that is consistent with
//!   what is chosen: version pins, Conflicts, Breaks, forbidden patterns) undoes the trail
//!   back to the latest choice point with an untried option (chronological backtracking);
//! - options whose own dependencies cannot exist in the universe are skipped up front, which
//!   removes nearly all backtracking on real Debian data;
//! - unsatisfiable requests report the deepest dead end with the chain that led to it and
//!   why each candidate was rejected.

pub mod cached;
mod explain;
mod search;
mod universe;

pub use cached::CachedUniverse;
pub use explain::{Rejection, Unsatisfiable};
pub use search::{Parent, Root, Solution, SolveError, SolveOptions, solve};
pub use universe::{Catalog, PkgId, Provider, Universe};
