//! Admin policy overlays (`*.policy.yaml`): YAML shape, validation, typed model. Several
//! stack (site, then partition); `merge` checks that later ones only narrow.

mod model;
mod parse;
mod raw;

pub use model::{
    Defaults, DistRule, IdRange, ImageRules, MigrationRules, NetworkRule, POLICY_VERSION, Policy,
    PolicyRules,
};

use crate::yaml::{Diagnostics, Source, YamlError};
use std::path::Path;

/// Reads and validates a policy file. Relative `source:` paths resolve from its directory.
pub fn load(path: &Path) -> Result<Policy, YamlError> {
    parse_source(&Source::read(path)?).map_err(YamlError::Invalid)
}

/// Validates a policy already in memory (tests, fuzzing).
pub fn parse_source(src: &Source) -> Result<Policy, Diagnostics> {
    let raw: raw::RawPolicy = crate::yaml::parse(src, "policy")?;
    parse::convert(src, raw)
}
