//! The effective environment: what `spec ⊕ policies` resolves to. This is the contract the
//! resolver, image builder and launcher read. Every value carries where it came from.

mod hash;
mod model;
mod provenance;
mod shares;

pub use hash::canonical_json;
pub use model::*;
pub use provenance::{Origin, Sourced};
pub use shares::{AllowedShare, DefaultDir, DefaultShare, SharePolicy, ShareSpec};
