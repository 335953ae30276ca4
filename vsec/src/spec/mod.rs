//! The user's environment spec (`*.vse.yaml`): YAML shape, validation, typed model.

mod model;
pub(crate) mod parse;
pub(crate) mod raw;
mod shares;

pub use model::{BaseSpec, CheckpointSpec, SPEC_VERSION, Spec};

use crate::yaml::{Source, YamlError};
use std::path::Path;

/// Reads and validates a spec file. Relative `source:` paths resolve from its directory.
pub fn load(path: &Path) -> Result<Spec, YamlError> {
    parse_source(&Source::read(path)?).map_err(YamlError::Invalid)
}

/// Validates a spec already in memory (tests, fuzzing).
pub fn parse_source(src: &Source) -> Result<Spec, crate::yaml::Diagnostics> {
    let raw: raw::RawSpec = crate::yaml::parse(src, "spec")?;
    parse::convert(src, raw)
}
