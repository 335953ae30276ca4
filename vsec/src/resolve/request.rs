use crate::deb::{Alternatives, Arch, PackageName, PackagePattern, Relation};
use crate::index::{PackagesIndex, Priority};
use crate::lock::{LOCK_FORMAT, LockedPackage, LockedRepository, Lockfile, Reason, SourceFiles};
use crate::repo::{
    Cache, Fetcher, LoadOptions, Location, RepoError, RetryPolicy, SourceEntry, ValidityCheck,
    load_repository,
};
use crate::solve::{Catalog, Parent, Root, SolveError, SolveOptions, Universe, solve};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Which packages form the base of every image (as mmdebstrap's variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BaseVariant {
    /// `Essential: yes` only.
    Essential,
    /// Essential plus `Priority: required`.
    #[default]
    Minbase,
    /// Minbase plus `Priority: important` and `standard`.
    Standard,
}

impl BaseVariant {
    pub fn as_str(self) -> &'static str {
        match self {
            BaseVariant::Essential => "essential",
            BaseVariant::Minbase => "minbase",
            BaseVariant::Standard => "standard",
        }
    }

    pub fn parse(s: &str) -> Option<BaseVariant> {
        match s {
            "essential" => Some(BaseVariant::Essential),
            "minbase" => Some(BaseVariant::Minbase),
            "standard" => Some(BaseVariant::Standard),
            _ => None,
        }
    }

    fn max_priority(self) -> Option<Priority> {
        match self {
            BaseVariant::Essential => None,
            BaseVariant::Minbase => Some(Priority::Required),
            BaseVariant::Standard => Some(Priority::Standard),
        }
    }
}

/// Where the repositories are and how to trust them.
#[derive(Debug, Clone)]
pub struct RepoConfig {
    pub sources: Vec<SourceEntry>,
    pub location: Location,
    /// `(from prefix, to prefix)`: a policy's mirror rewrite, applied to every source URI.
    pub mirror_rewrites: Vec<(String, String)>,
    pub arch: Arch,
    /// Keyrings for sources without their own `signed-by`.
    pub keyrings: Vec<PathBuf>,
    pub validity: ValidityCheck,
    /// `YYYYMMDDTHHMMSSZ`.
    pub snapshot: Option<String>,
    pub cache_dir: Option<PathBuf>,
    /// Where the index cache lives (see `load_universe_cached`); `None`: no index cache.
    pub index_cache: Option<PathBuf>,
    pub retry: RetryPolicy,
}

impl RepoConfig {
    /// The embedded default: the mirrors configured for apt on this host, read from what apt
    /// downloaded into `/var/lib/apt/lists` and verified against Debian's archive keyring.
    pub fn host(arch: Arch) -> Result<RepoConfig, ResolveError> {
        Ok(RepoConfig {
            sources: crate::repo::host_sources(std::path::Path::new("/"))
                .map_err(RepoError::from)?,
            location: Location::AptLists(PathBuf::from("/var/lib/apt/lists")),
            mirror_rewrites: Vec::new(),
            arch,
            keyrings: vec![PathBuf::from(
                "/usr/share/keyrings/debian-archive-keyring.gpg",
            )],
            validity: ValidityCheck::Now,
            snapshot: None,
            cache_dir: Cache::default_dir(),
            index_cache: Some(super::cached::default_index_cache_dir()),
            retry: RetryPolicy::default(),
        })
    }
}

/// A package asked for, and by whom (for the lockfile's `reason` and for messages).
#[derive(Debug, Clone)]
pub struct RequestedPackage {
    pub relation: Relation,
    pub reason: Reason,
}

/// What to resolve.
#[derive(Debug, Clone, Default)]
pub struct ResolveRequest {
    pub variant: BaseVariant,
    pub recommends: bool,
    /// Requested, policy-required and kernel packages, in the order given.
    pub packages: Vec<RequestedPackage>,
    /// Forbidden patterns with where they come from (e.g. `policy site.yaml`).
    pub forbidden: Vec<(PackagePattern, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error("no repositories configured: add sources (or check /etc/apt/sources.list.d)")]
    NoSources,
    #[error(
        "this host's apt sources have no `{suite}` suite and neither the spec nor a policy names an archive; hint: add `base.mirror: http://mirror.example.org/debian` (your Debian mirror) to the spec, or an apt source for {suite}"
    )]
    NoHostSource { suite: String },
    #[error(
        "repository {uri} ({origin}) is not allowed by {policy}: allowed are {}; hint: name an allowed archive in base.mirror, or ask your admin", allowed.join(", ")
    )]
    NotAllowed {
        uri: String,
        origin: String,
        policy: String,
        allowed: Vec<String>,
    },
    #[error("unknown package `{name}` ({origin}){}", did_you_mean(.suggestions))]
    UnknownPackage {
        name: String,
        origin: String,
        suggestions: Vec<String>,
    },
    #[error(
        "no version of `{name}` satisfies `{relation}` ({origin}); available: {}",
        .available.join(", ")
    )]
    NoMatchingVersion {
        name: String,
        relation: String,
        origin: String,
        available: Vec<String>,
    },
    #[error("{what} is forbidden ({pattern}) but {origin} asks for it")]
    ForbiddenRequest {
        what: String,
        pattern: String,
        origin: String,
    },
    #[error(transparent)]
    Solve(#[from] SolveError),
    #[error("the index cache is damaged ({0}); it is rebuilt on the next run")]
    DamagedCache(String),
}

/// Every resolver error is about the input: an unknown package, a conflict, a repository
/// that does not verify or cannot be reached is fixed in the spec, policy or sources.
impl vse_exit::Classify for ResolveError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

fn did_you_mean(s: &[String]) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", s.join(", "))
    }
}

/// Result of a resolution: locked packages sorted by name, and the repositories.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub packages: Vec<LockedPackage>,
    pub steps: u64,
    pub backtracks: u64,
}

impl Resolution {
    pub fn into_lockfile(
        self,
        env_hash: String,
        source: SourceFiles,
        arch: Arch,
        repositories: Vec<LockedRepository>,
    ) -> Lockfile {
        Lockfile {
            format: LOCK_FORMAT,
            env_hash,
            generator: format!("vse {}", env!("CARGO_PKG_VERSION")),
            architecture: arch,
            source,
            repositories,
            packages: self.packages,
        }
    }
}

/// Loads and verifies every repository and builds the candidate universe.
pub fn load_universe(cfg: &RepoConfig) -> Result<(Universe, Vec<LockedRepository>), ResolveError> {
    if cfg.sources.is_empty() {
        return Err(ResolveError::NoSources);
    }
    let opts = LoadOptions {
        arch: cfg.arch.clone(),
        default_keyrings: cfg.keyrings.clone(),
        validity: cfg.validity,
        cache: cfg.cache_dir.as_deref().map(Cache::new),
        snapshot: cfg.snapshot.clone(),
    };
    let mut fetcher = Fetcher::new(cfg.retry.clone());
    let mut index = PackagesIndex::default();
    let mut repos = Vec::new();
    for (i, src) in cfg.sources.iter().enumerate() {
        let mut src = src.clone();
        src.rewrite(&cfg.mirror_rewrites);
        let loaded = load_repository(&src, &cfg.location, &opts, &mut fetcher, i)?;
        index.extend(loaded.index);
        repos.push(loaded.locked);
    }
    Ok((Universe::new(index, &cfg.arch), repos))
}

/// Loads the repositories and resolves.
pub fn resolve(
    cfg: &RepoConfig,
    req: &ResolveRequest,
) -> Result<(Resolution, Vec<LockedRepository>), ResolveError> {
    let (u, repos) = load_universe(cfg)?;
    Ok((resolve_in(&u, req)?, repos))
}

fn reason_label(r: &Reason) -> String {
    match r {
        Reason::Requested => "requested".into(),
        Reason::Policy { policy } => format!("required by policy {policy}"),
        Reason::Kernel => "the kernel".into(),
        Reason::Initramfs => "the initramfs".into(),
        Reason::Base { variant } => format!("base {variant}"),
        Reason::Dependency { of } => format!("dependency of {of}"),
    }
}

/// The base set's names (sorted, so roots are deterministic).
pub fn base_names(u: &dyn Catalog, variant: BaseVariant) -> BTreeSet<PackageName> {
    u.base_candidates()
        .into_iter()
        .map(|id| u.package(id))
        .filter(|p| p.essential || variant.max_priority().is_some_and(|m| p.priority <= m))
        .map(|p| p.name.clone())
        .collect()
}

fn check_requested(u: &dyn Catalog, rp: &RequestedPackage) -> Result<(), ResolveError> {
    let r = &rp.relation;
    let name = r.name.as_str();
    let real = u.by_name(name);
    if real.is_empty() && u.providers(name).is_empty() {
        let mut scored: Vec<(f64, &str)> = u
            .names()
            .into_iter()
            .map(|n| (strsim::jaro_winkler(name, n), n))
            .filter(|(s, _)| *s > 0.85)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        scored.dedup_by(|a, b| a.1 == b.1);
        return Err(ResolveError::UnknownPackage {
            name: name.to_string(),
            origin: reason_label(&rp.reason),
            suggestions: scored.iter().take(3).map(|(_, n)| n.to_string()).collect(),
        });
    }
    if let Some(c) = &r.constraint {
        let any_real = real.iter().any(|&id| c.matches(&u.package(id).version));
        let any_prov = u.providers(name).iter().any(|&id| {
            u.package(id).provides.iter().any(|pv| {
                pv.name == r.name
                    && pv
                        .constraint
                        .as_ref()
                        .is_some_and(|pc| c.matches(&pc.version))
            })
        });
        if !any_real && !any_prov {
            return Err(ResolveError::NoMatchingVersion {
                name: name.to_string(),
                relation: r.to_string(),
                origin: reason_label(&rp.reason),
                available: real
                    .iter()
                    .map(|&id| u.package(id).version.to_string())
                    .collect(),
            });
        }
    }
    Ok(())
}

/// Resolves a request against an already loaded universe.
pub fn resolve_in(u: &dyn Catalog, req: &ResolveRequest) -> Result<Resolution, ResolveError> {
    let r = resolve_unchecked(u, req);
    // A damaged cache record seen on the way voids the answer, whatever it was.
    match u.fault() {
        Some(why) => Err(ResolveError::DamagedCache(why)),
        None => r,
    }
}

fn resolve_unchecked(u: &dyn Catalog, req: &ResolveRequest) -> Result<Resolution, ResolveError> {
    let mut roots: Vec<Root> = Vec::new();
    let mut root_reasons: Vec<Reason> = Vec::new();
    for rp in &req.packages {
        check_requested(u, rp)?;
        if let Some((pat, origin)) = req
            .forbidden
            .iter()
            .find(|(p, _)| p.matches_name(&rp.relation.name) && p.constraint.is_none())
        {
            return Err(ResolveError::ForbiddenRequest {
                what: rp.relation.to_string(),
                pattern: format!("`{pat}` by {origin}"),
                origin: reason_label(&rp.reason),
            });
        }
    }
    // The base set first, then what was asked for: the order mmdebstrap and apt use.
    let variant = req.variant.as_str().to_string();
    for name in base_names(u, req.variant) {
        // A forbidden base package is left out; anything that needs it then fails with the
        // chain that pulled it in.
        if req.packages.iter().any(|rp| rp.relation.name == name)
            || req.forbidden.iter().any(|(p, _)| p.matches_name(&name))
        {
            continue;
        }
        let rel = crate::deb::parse_relation(name.as_str()).expect("package names are relations");
        roots.push(Root {
            group: vec![rel],
            label: format!("base {variant}"),
        });
        root_reasons.push(Reason::Base {
            variant: variant.clone(),
        });
    }
    for rp in &req.packages {
        roots.push(Root {
            group: vec![rp.relation.clone()] as Alternatives,
            label: reason_label(&rp.reason),
        });
        root_reasons.push(rp.reason.clone());
    }
    let opts = SolveOptions {
        recommends: req.recommends,
        forbidden: req.forbidden.clone(),
        max_steps: 0,
    };
    let sol = solve(u, &roots, &opts)?;
    let mut packages: Vec<LockedPackage> = sol
        .chosen
        .iter()
        .map(|&(id, parent)| {
            let p = u.package(id);
            LockedPackage {
                name: p.name.clone(),
                version: p.version.clone(),
                architecture: p.architecture.clone(),
                filename: p.filename.clone(),
                size: p.size,
                sha256: p.sha256.clone(),
                repository: p.repository,
                reason: match parent {
                    Parent::Root(i) => root_reasons[i].clone(),
                    Parent::Package(q) => Reason::Dependency {
                        of: u.package(q).name.clone(),
                    },
                },
            }
        })
        .collect();
    packages.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then_with(|| a.architecture.cmp(&b.architecture))
    });
    Ok(Resolution {
        packages,
        steps: sol.steps,
        backtracks: sol.backtracks,
    })
}
