//! Debian primitives shared by the spec, the policy and the resolver: names, versions,
//! relationship fields.

pub mod name;
pub mod pattern;
pub mod relation;
pub mod version;

pub use name::{Arch, NameError, PackageName};
pub use pattern::PackagePattern;
pub use relation::{
    Alternatives, ArchQualifier, Relation, RelationError, VersionConstraint, VersionOp,
    parse_relation, parse_relations,
};
pub use version::{DebVersion, VersionError};
