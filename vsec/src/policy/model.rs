//! The validated policy. Every rule keeps its position so a violation can name it.

use crate::deb::{Arch, PackagePattern, Relation};
use crate::env::{AllowedShare, BarrierAction, CheckpointMode, DefaultShare, FileEntry, Variant};
use crate::units::{
    AbsPath, ByteSize, HostnamePattern, Hypervisor, MirrorUrl, Seconds, UnixName, Word,
};
use crate::yaml::Loc;
use ipnet::IpNet;
use std::sync::Arc;

pub const POLICY_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub file: Arc<str>,
    pub name: Loc<Word>,
    pub description: Option<String>,
    /// Whose policy it is: the site's (its directory, plugstack.conf) or a user's (`--policy`).
    pub layer: Layer,
    /// What the policy says. A policy stack combines into the same shape (`merge::Stack`).
    pub rules: PolicyRules,
}

/// Whose policy a file is. A user's policy may narrow the site's but never choose what the
/// site trusts ([`crate::policy::MergeRule::TrustRoot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layer {
    Site,
    #[default]
    User,
}

impl Policy {
    /// This policy, as one of the site's own.
    pub fn site(mut self) -> Policy {
        self.layer = Layer::Site;
        self
    }
}

/// Field access reads through to the rules: `policy.max_vcpus`.
impl std::ops::Deref for Policy {
    type Target = PolicyRules;
    fn deref(&self) -> &PolicyRules {
        &self.rules
    }
}

/// The rules of one policy, or of a whole stack once combined. Every rule keeps the position
/// of the line that set it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyRules {
    /// Allowed distributions; `None`: this policy does not restrict them.
    pub distributions: Option<Loc<Vec<DistRule>>>,
    /// Archive URLs a spec may name (component-wise prefixes).
    pub allowed_mirrors: Option<Loc<Vec<Loc<MirrorUrl>>>>,
    /// The site mirror every archive is rewritten to.
    pub mirror: Option<Loc<MirrorUrl>>,
    pub keyrings: Option<Loc<Vec<AbsPath>>>,
    pub required_packages: Vec<Loc<Relation>>,
    pub forbidden_packages: Vec<Loc<PackagePattern>>,
    pub max_vcpus: Option<Loc<u32>>,
    pub max_memory: Option<Loc<ByteSize>>,
    pub vms_per_core: Option<Loc<u32>>,
    pub defaults: Defaults,
    pub required_files: Vec<Loc<FileEntry>>,
    /// Directories (or files) users may not add files under.
    pub protected_paths: Vec<Loc<AbsPath>>,
    pub uid_range: Option<Loc<IdRange>>,
    pub gid_range: Option<Loc<IdRange>>,
    /// May a job ask to run its command as the guest's root (default: no, it runs as its
    /// user)? Only the site's policies grant it.
    pub allow_root: Option<Loc<bool>>,
    pub network: Option<NetworkRule>,
    /// `true`: every job checkpoints when its walltime ends; users cannot opt out.
    pub checkpoint_at_walltime_end: Option<Loc<bool>>,
    pub checkpoint_min_interval: Option<Loc<Seconds>>,
    /// How long a job's VMs outlive its `vse launch` process, waiting for `vse attach`.
    pub checkpoint_attach_grace: Option<Loc<Seconds>>,
    pub hypervisors: Option<Loc<Vec<Loc<Hypervisor>>>>,
    pub migration: MigrationRules,
    pub images: ImageRules,
    pub shares: PolicyShares,
    /// The file every audited action appends its JSON record to (`audit.file`). Only the
    /// site's policies set it ([`crate::policy::MergeRule::TrustRoot`]).
    pub audit_file: Option<Loc<AbsPath>>,
    /// The group whose members, through `sudo vse`, may act on any user's job
    /// (`authority.admin_group`). Only the site's policies set it.
    pub admin_group: Option<Loc<UnixName>>,
    /// The most the image caches vse keeps for jobs may take on a node (`cache.max_size`),
    /// least recently used entries going first.
    pub cache_max_size: Option<Loc<ByteSize>>,
    /// How long an image may sit unused in those caches (`cache.max_age`).
    pub cache_max_age: Option<Loc<Seconds>>,
}

/// Which host directories jobs may share into their guests (`shares:`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyShares {
    /// Prefixes shares must lie under (`None`: any directory the user can read).
    pub allowed: Option<Loc<Vec<Loc<AllowedShare>>>>,
    /// What every job gets unasked (`None`: the built-in default, the launch directory).
    pub default: Option<Loc<Vec<Loc<DefaultShare>>>>,
    /// Prefixes never shared, whatever `allowed` says.
    pub forbidden: Vec<Loc<AbsPath>>,
}

/// Which images from outside vse (`vse import`) may run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImageRules {
    /// `false`: only images built by vse from a spec; imported ones are refused.
    pub allow_imported: Option<Loc<bool>>,
    /// `true`: an imported image must have a dpkg database, so that the package rules
    /// (forbidden, required) can be checked against what it holds.
    pub require_dpkg_database: Option<Loc<bool>>,
    /// Keyrings (armored public keys): an image must carry a signature of its manifest by a
    /// key of each list, so that a site can make its build service the only source of
    /// images. A stack keeps every policy's list: each one adds a requirement.
    pub signed_by: Vec<Loc<Vec<AbsPath>>>,
    /// `false`: `vse launch` boots every VM from its kernel, never from a node's saved boot
    /// template of the image (memory state after boot).
    pub boot_templates: Option<Loc<bool>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DistRule {
    pub name: Loc<Word>,
    pub suites: Vec<Loc<Word>>,
    pub architectures: Option<Vec<Loc<Arch>>>,
    pub components: Option<Vec<Loc<Word>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub min: u32,
    pub max: u32,
}

impl IdRange {
    pub fn contains(self, id: u32) -> bool {
        (self.min..=self.max).contains(&id)
    }
    pub fn within(self, outer: IdRange) -> bool {
        outer.min <= self.min && self.max <= outer.max
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Defaults {
    pub vcpus: Option<Loc<u32>>,
    pub memory: Option<Loc<ByteSize>>,
    pub variant: Option<Loc<Variant>>,
    pub hypervisor: Option<Loc<Hypervisor>>,
    pub checkpoint: Option<Loc<CheckpointMode>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NetworkRule {
    pub ip_range: Loc<IpNet>,
    pub hostname: Loc<HostnamePattern>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct MigrationRules {
    pub active_memory_threshold: Option<Loc<f64>>,
    pub outlier_sigma: Option<Loc<f64>>,
    pub persistence: Option<Loc<(u32, u32)>>,
    pub oversubscription_threshold: Option<Loc<f64>>,
    pub consolidation: Option<Loc<bool>>,
    pub cooldown: Option<Loc<Seconds>>,
    pub max_concurrent: Option<Loc<u32>>,
    pub barrier_deadline: Option<Loc<Seconds>>,
    pub barrier_action: Option<Loc<BarrierAction>>,
}
