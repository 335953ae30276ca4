//! `spec ⊕ policies → effective environment`. A pure function over typed values: policy
//! wins, policy defaults fill what the user left out, every violation is reported (all of
//! them, each naming the spec's and the policy's line), and every value records its origin.

mod checks;
pub mod images;
mod shares;
mod stack;

pub use stack::{Stack, stack};

/// The stack's `shares.*` as the effective environment carries them.
pub fn share_policy(st: &Stack) -> crate::env::SharePolicy {
    shares::share_policy(&st.shares)
}

use crate::deb::{Arch, PackageName};
use crate::env::{
    BarrierAction, Base, Checkpoint, CheckpointMode, EffectiveEnv, EnvVar, FORMAT_VERSION,
    HypervisorChoice, ImagePolicy, Limits, Migration, Network, Resources, Sourced, Variant,
};
use crate::policy::Policy;
use crate::spec::Spec;
use crate::units::{AbsPath, ByteSize, Hypervisor, Seconds};
use crate::yaml::{Diagnostics, Loc};

/// Built-in defaults, used when neither the spec nor any policy says otherwise.
pub mod defaults {
    pub const VCPUS: u32 = 1;
    pub const MEMORY_MIB: u64 = 1024;
    pub const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
    pub const ARCH: &str = "amd64";
    pub const COMPONENT: &str = "main";
    pub const ACTIVE_MEMORY_THRESHOLD: f64 = 0.75;
    pub const OUTLIER_SIGMA: f64 = 2.0;
    pub const PERSISTENCE: (u32, u32) = (3, 5);
    pub const OVERSUBSCRIPTION_THRESHOLD: f64 = 0.5;
    pub const COOLDOWN_S: u64 = 300;
    pub const MAX_CONCURRENT: u32 = 1;
    pub const BARRIER_DEADLINE_S: u64 = 30;
}

/// The user's value, else the policy's, else the built-in default.
fn pick<T: Clone>(user: Option<&Loc<T>>, policy: Option<&Loc<T>>, default: T) -> Sourced<T> {
    match (user, policy) {
        (Some(u), _) => Sourced::user(u.value.clone(), u.at.clone()),
        (None, Some(p)) => Sourced::policy(p.value.clone(), p.at.clone()),
        (None, None) => Sourced::default(default),
    }
}

fn from_policy<T: Clone>(policy: Option<&Loc<T>>, default: T) -> Sourced<T> {
    pick(None, policy, default)
}

fn user<T: Clone>(l: &Loc<T>) -> Sourced<T> {
    Sourced::user(l.value.clone(), l.at.clone())
}

fn pol<T: Clone>(l: &Loc<T>) -> Sourced<T> {
    Sourced::policy(l.value.clone(), l.at.clone())
}

/// Merges a spec with a stack of policies (earliest first).
pub fn merge(spec: &Spec, policies: &[Policy]) -> Result<EffectiveEnv, Diagnostics> {
    let (st, mut diags) = stack(policies);
    diags.extend(checks::check(spec, &st));
    if !diags.is_empty() {
        return Err(diags.sorted());
    }
    Ok(build(spec, &st))
}

fn build(spec: &Spec, st: &Stack) -> EffectiveEnv {
    let b = &spec.base;
    // Literals below are known-valid; parsing them cannot fail.
    let default_arch = Arch::new(defaults::ARCH).expect("valid literal");
    let architecture = pick(b.architecture.as_ref(), None, default_arch);
    let requested_mirror = b.mirror.as_ref().map(user);
    let mirror = st
        .mirror
        .as_ref()
        .map(pol)
        .or_else(|| requested_mirror.clone());
    let components = match &b.components {
        Some(c) => Sourced::user(
            c.value.iter().map(|w| w.value.clone()).collect(),
            c.at.clone(),
        ),
        None => Sourced::default(vec![
            crate::units::Word::parse(defaults::COMPONENT).expect("valid literal"),
        ]),
    };
    let base = Base {
        distribution: user(&b.distribution),
        suite: user(&b.suite),
        architecture: architecture.clone(),
        components,
        mirror,
        requested_mirror,
        allowed_mirrors: st.allowed_mirrors.as_ref().map(|a| {
            Sourced::policy(
                a.value.iter().map(|m| m.value.clone()).collect(),
                a.at.clone(),
            )
        }),
        snapshot: b.snapshot.as_ref().map(user),
        variant: pick(
            b.variant.as_ref(),
            st.defaults.variant.as_ref(),
            Variant::Minbase,
        ),
        install_recommends: pick(b.recommends.as_ref(), None, false),
        keyrings: from_policy(
            st.keyrings.as_ref(),
            vec![AbsPath::parse(defaults::DEBIAN_KEYRING).expect("valid literal")],
        ),
    };
    let kernel = pick(
        spec.kernel.as_ref(),
        None,
        default_kernel(&architecture.value),
    );
    let mut files: Vec<_> = spec.files.iter().map(user).collect();
    files.extend(st.required_files.iter().map(pol));
    EffectiveEnv {
        format: FORMAT_VERSION,
        name: user(&spec.name),
        description: spec.description.clone(),
        base,
        kernel,
        packages: spec.packages.iter().map(user).collect(),
        required_packages: st.required_packages.iter().map(pol).collect(),
        forbidden: st.forbidden_packages.iter().map(pol).collect(),
        files,
        groups: spec.groups.iter().map(user).collect(),
        users: spec.users.iter().map(user).collect(),
        environment: spec
            .environment
            .iter()
            .map(|(k, v)| {
                Sourced::user(
                    EnvVar {
                        name: k.clone(),
                        value: v.value.clone(),
                    },
                    v.at.clone(),
                )
            })
            .collect(),
        post_install: spec.post_install.iter().map(user).collect(),
        resources: Resources {
            vcpus: pick(
                spec.vcpus.as_ref(),
                st.defaults.vcpus.as_ref(),
                defaults::VCPUS,
            ),
            memory: pick(
                spec.memory.as_ref(),
                st.defaults.memory.as_ref(),
                ByteSize::from_mib(defaults::MEMORY_MIB),
            ),
        },
        limits: limits(st),
        network: network(st),
        checkpoint: checkpoint(spec.checkpoint.as_ref(), st),
        hypervisor: HypervisorChoice {
            preferred: match (&spec.hypervisor, &st.defaults.hypervisor) {
                (Some(h), _) => Some(user(h)),
                (None, Some(h)) => Some(pol(h)),
                (None, None) => None,
            },
            allowed: allowed_hypervisors(st),
        },
        migration: migration(st),
        images: image_policy(st),
        allow_root: allow_root(st),
        shares: spec.shares.iter().map(user).collect(),
        share_policy: share_policy(st),
    }
}

/// Whether a job may run as the guest's root (off unless a site policy grants it).
pub fn allow_root(st: &Stack) -> Sourced<bool> {
    from_policy(st.allow_root.as_ref(), false)
}

/// Where every audited action appends its JSON record, if a policy of the stack names a file
/// (`audit.file`; only the site's policies may, [`crate::policy::MergeRule::TrustRoot`]).
pub fn audit_file(st: &Stack) -> Option<AbsPath> {
    st.audit_file.as_ref().map(|f| f.value.clone())
}

/// The group whose members may act on any user's job through `sudo vse`, with the policy line
/// that names it (`authority.admin_group`; only the site's policies may).
pub fn admin_group(st: &Stack) -> Option<&Loc<crate::units::UnixName>> {
    st.admin_group.as_ref()
}

/// The stack's rules for imported images (defaults: allowed, no dpkg database needed).
pub fn image_policy(st: &Stack) -> ImagePolicy {
    ImagePolicy {
        allow_imported: from_policy(st.images.allow_imported.as_ref(), true),
        require_dpkg_database: from_policy(st.images.require_dpkg_database.as_ref(), false),
        signed_by: st.images.signed_by.iter().map(pol).collect(),
        boot_templates: from_policy(st.images.boot_templates.as_ref(), true),
    }
}

/// The resource limits of a policy stack (no oversubscription where no policy speaks).
/// When jobs checkpoint: the spec's wish (else the policy's default), the policy's
/// walltime rule, which users cannot opt out of, and its minimum interval.
pub fn checkpoint(spec: Option<&crate::spec::CheckpointSpec>, st: &Stack) -> Checkpoint {
    let mode = pick(
        spec.map(|c| &c.mode),
        st.defaults.checkpoint.as_ref(),
        CheckpointMode::Never,
    );
    let at_walltime_end = match &st.checkpoint_at_walltime_end {
        Some(r) if r.value => pol(r),
        _ => Sourced {
            value: mode.value != CheckpointMode::Never,
            from: mode.from.clone(),
        },
    };
    Checkpoint {
        mode,
        interval: spec.and_then(|c| c.interval.as_ref()).map(user),
        at_walltime_end,
        min_interval: st.checkpoint_min_interval.as_ref().map(pol),
        attach_grace: st.checkpoint_attach_grace.as_ref().map(pol),
    }
}

pub fn limits(st: &Stack) -> Limits {
    Limits {
        max_vcpus: st.max_vcpus.as_ref().map(pol),
        max_memory: st.max_memory.as_ref().map(pol),
        vms_per_core: from_policy(st.vms_per_core.as_ref(), 1),
        cache_max_size: st.cache_max_size.as_ref().map(pol),
        cache_max_age: st.cache_max_age.as_ref().map(pol),
    }
}

/// The job network of a policy stack, if a policy gives one.
pub fn network(st: &Stack) -> Option<Network> {
    st.network.as_ref().map(|n| Network {
        ip_range: pol(&n.ip_range),
        hostname: pol(&n.hostname),
    })
}

/// The hypervisors a policy stack allows (all of them where no policy speaks).
pub fn allowed_hypervisors(st: &Stack) -> Sourced<Vec<Hypervisor>> {
    match &st.hypervisors {
        Some(a) => Sourced::policy(a.value.iter().map(|h| h.value).collect(), a.at.clone()),
        None => Sourced::default(Hypervisor::ALL.to_vec()),
    }
}

/// The cloud kernel boots ~2.5x faster under emulation; only amd64 and arm64 have one.
pub fn default_kernel(arch: &Arch) -> PackageName {
    let name = match arch.as_str() {
        "amd64" | "arm64" => format!("linux-image-cloud-{arch}"),
        other => format!("linux-image-{other}"),
    };
    PackageName::new(&name)
        .unwrap_or_else(|_| PackageName::new("linux-image-amd64").expect("valid literal"))
}

/// The migration daemon's settings of a policy stack (defaults where no policy speaks).
pub fn migration(st: &Stack) -> Migration {
    let m = &st.migration;
    let (k, mm) = match &m.persistence {
        Some(p) => (
            Sourced::policy(p.value.0, p.at.clone()),
            Sourced::policy(p.value.1, p.at.clone()),
        ),
        None => (
            Sourced::default(defaults::PERSISTENCE.0),
            Sourced::default(defaults::PERSISTENCE.1),
        ),
    };
    Migration {
        active_memory_threshold: from_policy(
            m.active_memory_threshold.as_ref(),
            defaults::ACTIVE_MEMORY_THRESHOLD,
        ),
        outlier_sigma: from_policy(m.outlier_sigma.as_ref(), defaults::OUTLIER_SIGMA),
        persistence_k: k,
        persistence_m: mm,
        oversubscription_threshold: from_policy(
            m.oversubscription_threshold.as_ref(),
            defaults::OVERSUBSCRIPTION_THRESHOLD,
        ),
        consolidation: from_policy(m.consolidation.as_ref(), false),
        cooldown: from_policy(m.cooldown.as_ref(), Seconds::new(defaults::COOLDOWN_S)),
        max_concurrent: from_policy(m.max_concurrent.as_ref(), defaults::MAX_CONCURRENT),
        barrier_deadline: from_policy(
            m.barrier_deadline.as_ref(),
            Seconds::new(defaults::BARRIER_DEADLINE_S),
        ),
        barrier_action: from_policy(m.barrier_action.as_ref(), BarrierAction::Migrate),
    }
}
