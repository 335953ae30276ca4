//! Admin policy overlays (`*.policy.yaml`): YAML shape, validation, typed model. Several
//! stack (site, then partition); `merge` checks that later ones only narrow.

mod model;
mod parse;
pub(crate) mod raw;
mod rules;
mod shares;

pub use model::{
    Defaults, DistRule, IdRange, ImageRules, Layer, MigrationRules, NetworkRule, POLICY_VERSION,
    Policy, PolicyRules, PolicyShares,
};
pub use rules::{MERGE_RULES, MergeRule, rule};

use crate::yaml::{Diagnostics, Source, YamlError};
use std::path::Path;

/// Reads and validates a policy file. Relative `source:` paths resolve from its directory.
/// It is a site policy when it is one of the files of the site's stack as this process sees
/// it (`crate::site`), else a user's, whoever names it.
pub fn load(path: &Path) -> Result<Policy, YamlError> {
    load_as(path, &crate::site::SiteEnv::from_process())
}

/// As [`load`], the site as `env` describes it.
pub fn load_as(path: &Path, env: &crate::site::SiteEnv) -> Result<Policy, YamlError> {
    let p = parse_source(&Source::read(path)?).map_err(YamlError::Invalid)?;
    Ok(if crate::site::is_site_policy(path, env) {
        p.site()
    } else {
        p
    })
}

/// Validates a policy already in memory (tests, fuzzing).
pub fn parse_source(src: &Source) -> Result<Policy, Diagnostics> {
    let raw: raw::RawPolicy = crate::yaml::parse(src, "policy")?;
    parse::convert(src, raw)
}
