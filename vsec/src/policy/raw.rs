//! The policy as written: YAML shape only; validated in `parse.rs`.

use crate::spec::raw::RawFile;
use crate::yaml::At;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub version: At<u32>,
    pub name: At<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub distributions: Option<At<Vec<At<RawDistribution>>>>,
    #[serde(default)]
    pub repositories: Option<RawRepositories>,
    #[serde(default)]
    pub packages: Option<RawPackages>,
    #[serde(default)]
    pub limits: Option<RawLimits>,
    #[serde(default)]
    pub defaults: Option<RawDefaults>,
    #[serde(default)]
    pub files: Option<RawFiles>,
    #[serde(default)]
    pub users: Option<RawUsers>,
    #[serde(default)]
    pub network: Option<RawNetwork>,
    #[serde(default)]
    pub checkpoint: Option<RawCheckpointRule>,
    #[serde(default)]
    pub hypervisors: Option<RawHypervisors>,
    #[serde(default)]
    pub migration: Option<RawMigration>,
    #[serde(default)]
    pub images: Option<RawImages>,
    #[serde(default)]
    pub shares: Option<RawShares>,
    #[serde(default)]
    pub audit: Option<RawAudit>,
    #[serde(default)]
    pub authority: Option<RawAuthority>,
    #[serde(default)]
    pub cache: Option<RawCache>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    #[serde(default)]
    pub max_size: Option<At<String>>,
    #[serde(default)]
    pub max_age: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthority {
    #[serde(default)]
    pub admin_group: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    #[serde(default)]
    pub file: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShares {
    #[serde(default)]
    pub allowed: Option<At<Vec<At<RawAllowedShare>>>>,
    #[serde(default)]
    pub default: Option<At<Vec<At<String>>>>,
    #[serde(default)]
    pub forbidden: Vec<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAllowedShare {
    pub path: At<String>,
    #[serde(default)]
    pub mode: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImages {
    #[serde(default)]
    pub allow_imported: Option<At<bool>>,
    #[serde(default)]
    pub require_dpkg_database: Option<At<bool>>,
    #[serde(default)]
    pub signed_by: Option<At<Vec<At<String>>>>,
    #[serde(default)]
    pub boot_templates: Option<At<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDistribution {
    pub name: At<String>,
    pub suites: Vec<At<String>>,
    #[serde(default)]
    pub architectures: Option<Vec<At<String>>>,
    #[serde(default)]
    pub components: Option<Vec<At<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRepositories {
    #[serde(default)]
    pub allowed: Option<At<Vec<At<String>>>>,
    #[serde(default)]
    pub mirror: Option<At<String>>,
    #[serde(default)]
    pub keyrings: Option<At<Vec<At<String>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPackages {
    #[serde(default)]
    pub required: Vec<At<String>>,
    #[serde(default)]
    pub forbidden: Vec<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    #[serde(default)]
    pub max_vcpus: Option<At<u32>>,
    #[serde(default)]
    pub max_memory: Option<At<String>>,
    #[serde(default)]
    pub vms_per_core: Option<At<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    #[serde(default)]
    pub vcpus: Option<At<u32>>,
    #[serde(default)]
    pub memory: Option<At<String>>,
    #[serde(default)]
    pub variant: Option<At<String>>,
    #[serde(default)]
    pub hypervisor: Option<At<String>>,
    #[serde(default)]
    pub checkpoint: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFiles {
    #[serde(default)]
    pub required: Vec<At<RawFile>>,
    #[serde(default)]
    pub protected: Vec<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUsers {
    #[serde(default)]
    pub uid_range: Option<At<RawRange>>,
    #[serde(default)]
    pub gid_range: Option<At<RawRange>>,
    #[serde(default)]
    pub allow_root: Option<At<bool>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRange {
    pub min: u32,
    pub max: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetwork {
    pub ip_range: At<String>,
    pub hostname: At<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCheckpointRule {
    #[serde(default)]
    pub at_walltime_end: Option<At<bool>>,
    #[serde(default)]
    pub min_interval: Option<At<String>>,
    #[serde(default)]
    pub attach_grace: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHypervisors {
    pub allowed: At<Vec<At<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMigration {
    #[serde(default)]
    pub active_memory_threshold: Option<At<f64>>,
    #[serde(default)]
    pub outlier_sigma: Option<At<f64>>,
    #[serde(default)]
    pub persistence: Option<At<RawPersistence>>,
    #[serde(default)]
    pub oversubscription_threshold: Option<At<f64>>,
    #[serde(default)]
    pub consolidation: Option<At<bool>>,
    #[serde(default)]
    pub cooldown: Option<At<String>>,
    #[serde(default)]
    pub max_concurrent: Option<At<u32>>,
    #[serde(default)]
    pub barrier: Option<RawBarrier>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPersistence {
    pub k: u32,
    pub m: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBarrier {
    #[serde(default)]
    pub deadline: Option<At<String>>,
    #[serde(default)]
    pub action: Option<At<String>>,
}
