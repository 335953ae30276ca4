//! The effective environment's types. Field docs say what each consumer may rely on.

use super::Sourced;
use crate::deb::{Arch, PackageName, PackagePattern, Relation};
use crate::units::{
    AbsPath, ByteSize, FileMode, HostnamePattern, Hypervisor, MirrorUrl, Seconds, UnixName, Word,
};
use ipnet::IpNet;
use serde::Serialize;
use std::path::PathBuf;

pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EffectiveEnv {
    pub format: u32,
    pub name: Sourced<Word>,
    pub description: Option<String>,
    pub base: Base,
    pub kernel: Sourced<PackageName>,
    /// Packages the user asked for.
    pub packages: Vec<Sourced<Relation>>,
    /// Packages every policy in the stack requires (a monitoring or checkpoint library...).
    pub required_packages: Vec<Sourced<Relation>>,
    /// Patterns no package in the final set may match, dependencies included: the resolver
    /// checks them after resolution.
    pub forbidden: Vec<Sourced<PackagePattern>>,
    /// User files then policy-required files; no two share a path.
    pub files: Vec<Sourced<FileEntry>>,
    pub groups: Vec<Sourced<Group>>,
    pub users: Vec<Sourced<User>>,
    pub environment: Vec<Sourced<EnvVar>>,
    /// Shell commands run in the image after packages are installed, in order.
    pub post_install: Vec<Sourced<String>>,
    pub resources: Resources,
    pub limits: Limits,
    pub network: Option<Network>,
    pub checkpoint: Checkpoint,
    pub hypervisor: HypervisorChoice,
    pub migration: Migration,
    /// Rules for images made outside vse (`vse import`). Left out of the JSON (and so of
    /// the env hash) while no policy sets them, so existing locks stay valid.
    #[serde(skip_serializing_if = "ImagePolicy::is_default")]
    pub images: ImagePolicy,
    /// May a job run its command as the guest's root (`users.allow_root`; else it runs as
    /// its user)? Left out of the JSON while no policy sets it, so existing locks stay valid.
    #[serde(skip_serializing_if = "Sourced::is_default")]
    pub allow_root: Sourced<bool>,
    /// Host directories the spec asks to share into the guest, as written; `vse launch`
    /// resolves them ([`crate::shares`]). Left out of the JSON when none, as are the rules.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Sourced<super::ShareSpec>>,
    /// The policies' `shares.*`.
    #[serde(skip_serializing_if = "super::SharePolicy::is_default")]
    pub share_policy: super::SharePolicy,
}

/// Which imported images may run (`images:` in a policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImagePolicy {
    pub allow_imported: Sourced<bool>,
    pub require_dpkg_database: Sourced<bool>,
    /// Keyrings, one list per policy that sets one: an image needs a signature by each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signed_by: Vec<Sourced<Vec<AbsPath>>>,
    /// Whether VMs may start from a node's boot template of the image (default: yes).
    pub boot_templates: Sourced<bool>,
}

impl ImagePolicy {
    pub fn is_default(&self) -> bool {
        self.allow_imported.from == super::Origin::Default
            && self.require_dpkg_database.from == super::Origin::Default
            && self.signed_by.is_empty()
            && self.boot_templates.from == super::Origin::Default
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Only `Essential: yes` packages (plus what the spec asks).
    Essential,
    /// Essential + `Priority: required` + apt.
    Minbase,
    /// Minbase + `Priority: important` and `standard`.
    Standard,
}

impl Variant {
    pub const NAMES: [&'static str; 3] = ["essential", "minbase", "standard"];

    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "essential" => Some(Variant::Essential),
            "minbase" => Some(Variant::Minbase),
            "standard" => Some(Variant::Standard),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Base {
    pub distribution: Sourced<Word>,
    pub suite: Sourced<Word>,
    pub architecture: Sourced<Arch>,
    pub components: Sourced<Vec<Word>>,
    /// The archive to fetch from: the policy's mirror, else the one the spec names; `None`:
    /// the mirrors configured for apt on the host (for the suite and its -updates/-security).
    pub mirror: Option<Sourced<MirrorUrl>>,
    /// The archive the user named (or the default), before the rewrite.
    pub requested_mirror: Option<Sourced<MirrorUrl>>,
    /// The policies' `repositories.allowed`: every archive the lock is resolved from must lie
    /// within one of them, the host's apt sources included.
    pub allowed_mirrors: Option<Sourced<Vec<MirrorUrl>>>,
    /// snapshot.debian.org timestamp `YYYYMMDDTHHMMSSZ`, when the user pinned one.
    pub snapshot: Option<Sourced<String>>,
    pub variant: Sourced<Variant>,
    pub install_recommends: Sourced<bool>,
    /// Host paths of the keyrings that verify the archive's Release file.
    pub keyrings: Sourced<Vec<AbsPath>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileContent {
    Inline(String),
    /// A host file; relative paths in a spec are resolved against the spec's directory.
    Source(SourceFile),
}

/// A `source:` as written (relative to the spec's or policy's directory) and where it was
/// found. Only the written form is part of the environment (and of its hash, which a lock
/// records): naming the spec `job.vse.yaml` or `/home/u/job.vse.yaml` is the same environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub path: PathBuf,
    pub written: String,
    /// A spec's source: the directory `written` must be read beneath (without following a
    /// symlink or `..`); `None` for a policy's (an admin names any host file).
    pub beneath: Option<PathBuf>,
}

impl Serialize for SourceFile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.written)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    pub path: AbsPath,
    pub content: FileContent,
    pub mode: FileMode,
    pub owner: UnixName,
    pub group: UnixName,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    pub name: UnixName,
    pub uid: u32,
    /// Primary group, then supplementary ones.
    pub groups: Vec<UnixName>,
    pub shell: AbsPath,
    pub home: AbsPath,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub name: UnixName,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub vcpus: Sourced<u32>,
    pub memory: Sourced<ByteSize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub max_vcpus: Option<Sourced<u32>>,
    pub max_memory: Option<Sourced<ByteSize>>,
    /// VMs per physical core; 1 means no oversubscription.
    pub vms_per_core: Sourced<u32>,
    /// The most a node's image caches for jobs may take (`cache.max_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_max_size: Option<Sourced<ByteSize>>,
    /// How long an image may sit unused in them (`cache.max_age`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_max_age: Option<Sourced<Seconds>>,
}

impl Limits {
    /// The image caches' bounds, as the nodes apply them.
    pub fn cache(&self) -> vse_base::evict::Limits {
        vse_base::evict::Limits {
            max_bytes: self.cache_max_size.as_ref().map(|s| s.value.bytes()),
            max_age_s: self.cache_max_age.as_ref().map(|s| s.value.get()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Network {
    pub ip_range: Sourced<IpNet>,
    pub hostname: Sourced<HostnamePattern>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointMode {
    Never,
    /// Checkpoint once, when the job's walltime is about to end.
    WalltimeEnd,
    /// Checkpoint every `interval`, and at walltime end.
    Periodic,
}

impl CheckpointMode {
    pub const NAMES: [&'static str; 3] = ["never", "walltime-end", "periodic"];

    pub fn parse(s: &str) -> Option<CheckpointMode> {
        match s {
            "never" => Some(CheckpointMode::Never),
            "walltime-end" => Some(CheckpointMode::WalltimeEnd),
            "periodic" => Some(CheckpointMode::Periodic),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    pub mode: Sourced<CheckpointMode>,
    /// Set when `mode` is periodic.
    pub interval: Option<Sourced<Seconds>>,
    /// The launcher checkpoints when the walltime ends (user's wish or policy rule).
    pub at_walltime_end: Sourced<bool>,
    /// Checkpoints at most this often (policy rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval: Option<Sourced<Seconds>>,
    /// How long the VMs outlive a lost `vse launch` for `vse attach` (policy rule; unset:
    /// the launcher's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_grace: Option<Sourced<Seconds>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HypervisorChoice {
    /// The user's (or policy default) preference; `None`: any allowed one.
    pub preferred: Option<Sourced<Hypervisor>>,
    pub allowed: Sourced<Vec<Hypervisor>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BarrierAction {
    Migrate,
    Cancel,
}

/// Settings for the migration daemon (failure avoidance and resource management).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Migration {
    /// Migrate away when a VM's active memory exceeds this fraction of its node.
    pub active_memory_threshold: Sourced<f64>,
    /// A metric more than this many standard deviations from its peers is an outlier.
    pub outlier_sigma: Sourced<f64>,
    /// A node is failing when `k` of the last `m` samples are outliers.
    pub persistence_k: Sourced<u32>,
    pub persistence_m: Sourced<u32>,
    /// Speculatively oversubscribe a node while its active memory stays below this fraction.
    pub oversubscription_threshold: Sourced<f64>,
    pub consolidation: Sourced<bool>,
    /// No VM migrates twice within this time.
    pub cooldown: Sourced<Seconds>,
    pub max_concurrent: Sourced<u32>,
    /// How long a barrier waits for every rank before `barrier_action`.
    pub barrier_deadline: Sourced<Seconds>,
    pub barrier_action: Sourced<BarrierAction>,
}

impl EffectiveEnv {
    /// Every package name the policy or user asks to install, kernel included.
    pub fn requested_names(&self) -> impl Iterator<Item = &PackageName> {
        std::iter::once(&self.kernel.value)
            .chain(self.packages.iter().map(|p| &p.value.name))
            .chain(self.required_packages.iter().map(|p| &p.value.name))
    }

    /// The first forbidden pattern `name` at `version` falls under, for the resolver.
    pub fn forbidden_match(
        &self,
        name: &PackageName,
        version: &crate::deb::DebVersion,
    ) -> Option<&Sourced<PackagePattern>> {
        self.forbidden
            .iter()
            .find(|p| p.value.matches(name, version))
    }
}
