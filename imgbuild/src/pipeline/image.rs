//! A lockfile's image: the locked packages, customised from the spec and policies the lock
//! names (files, users, groups, environment, post-install), unless packages only are wanted.

use super::{PipelineError, Report};
use crate::build::{AgentBinary, BuildOptions, BuildOutcome, build};
use crate::customize::{Customization, FileEntry, GroupEntry, UserEntry};
use crate::fetch::DebCache;
use crate::guard::{Guard, Rule};
use std::path::{Path, PathBuf};
use vse_image::manifest::PolicyRef;
use vsec::env::{EffectiveEnv, FileContent, Origin};
use vsec::lock::Lockfile;
use vsec::repo::ValidityCheck;
use vsec::resolve::{Expect, HostApt, LockSource, verify_lock};

/// What `vse build LOCK` builds.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub lock: PathBuf,
    /// Output directory (replaced atomically; an unchanged lock is a cache hit).
    pub output: PathBuf,
    pub qcow2: bool,
    pub tar: bool,
    pub agent: AgentBinary,
    /// Download cache (default: imgbuild's).
    pub cache: Option<PathBuf>,
    /// Ignore the spec named in the lock.
    pub packages_only: bool,
    /// Accept Release files past their Valid-Until when verifying the lock.
    pub allow_expired: bool,
    /// Neither use nor keep configured roots (layers): every package is unpacked and
    /// configured.
    pub no_layers: bool,
}

impl BuildRequest {
    /// A raw image of `lock` in `output`, customised, with the default download cache.
    pub fn new(lock: PathBuf, output: PathBuf, agent: AgentBinary) -> Self {
        BuildRequest {
            lock,
            output,
            qcow2: false,
            tar: false,
            agent,
            cache: None,
            packages_only: false,
            allow_expired: false,
            no_layers: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Built {
    pub outcome: BuildOutcome,
    /// The spec the image was customised from (`None`: packages only).
    pub customized_from: Option<PathBuf>,
}

/// Builds the image of the lockfile `req.lock`.
pub fn build_lock(req: &BuildRequest, report: &dyn Report) -> Result<Built, PipelineError> {
    let read_err = |error| PipelineError::ReadLock {
        path: req.lock.clone(),
        error,
    };
    let bytes = vse_base::read_input(&req.lock, vsec::lock::MAX_LOCK_BYTES).map_err(read_err)?;
    if bytes.len() as u64 > vsec::lock::MAX_LOCK_BYTES {
        return Err(read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "larger than {} MiB: not a lockfile",
                vsec::lock::MAX_LOCK_BYTES >> 20
            ),
        )));
    }
    let text = String::from_utf8(bytes.clone()).map_err(|_| PipelineError::LockNotUtf8 {
        path: req.lock.clone(),
    })?;
    let lock = Lockfile::from_toml(&req.lock, &text)?;
    crate::rootfs::idbase::check_for_this_process()?;
    // A cache nobody but this user may write, or no build (before any work is done).
    let cache_root = req.cache.clone().unwrap_or_else(DebCache::default_root);
    DebCache::open(&cache_root).map_err(PipelineError::Cache)?;
    let base = req.lock.parent().unwrap_or(Path::new("."));
    let customize = !req.packages_only && !lock.source.spec.as_os_str().is_empty();
    let locked = customize.then(|| locked_env(base, &lock)).transpose()?;
    let verified = {
        let packages_env;
        let (env, expect) = match &locked {
            Some((env, _)) => (env, Expect { kernel: true }),
            None => {
                let policies = (lock.source.policies.iter())
                    .map(|p| {
                        let path = base.join(p);
                        vsec::policy::load(&path)
                            .map_err(|error| PipelineError::LockedPolicy { path, error })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                packages_env = packages_only_env(base, &lock, &req.lock, policies)?;
                (&packages_env, Expect::default())
            }
        };
        let validity = if req.allow_expired {
            ValidityCheck::Ignore
        } else {
            ValidityCheck::Now
        };
        let src = LockSource {
            path: &req.lock,
            text: Some(&text),
        };
        report.resolving(true);
        let v = verify_lock(&lock, src, env, &HostApt::detect(), validity, expect);
        report.resolving(false);
        v.map_err(|e| PipelineError::Verify(Box::new(e)))?
    };
    let sde = std::env::var("SOURCE_DATE_EPOCH").ok();
    let plan =
        crate::from_lock::plan_from_lock(&verified, &bytes, sde.as_deref()).map_err(|error| {
            PipelineError::Plan {
                path: req.lock.clone(),
                error,
            }
        })?;

    let (customization, customized_from, policies) = match locked {
        None => (Customization::default(), None, vec![]),
        Some((env, guard)) => {
            let paths: Vec<PathBuf> = lock.source.policies.iter().map(|p| base.join(p)).collect();
            let mut c = to_customization(&env, base)?;
            c.guard = guard;
            (c, Some(base.join(&lock.source.spec)), policy_refs(&paths)?)
        }
    };

    let mut opts = BuildOptions::new(req.output.clone(), req.agent.clone());
    if let Some(c) = &req.cache {
        opts.cache_root = c.clone();
    }
    opts.qcow2 = req.qcow2;
    opts.tar = req.tar;
    if req.no_layers {
        opts.layer_cache = None;
    }
    opts.customization = customization;
    opts.policies = policies;
    let outcome = build(&plan, &opts, report.build()).map_err(|source| PipelineError::Build {
        out: req.output.clone(),
        input: req.lock.clone(),
        source: Box::new(source),
    })?;
    Ok(Built {
        outcome,
        customized_from,
    })
}

/// Each policy file with the SHA256 of its bytes, for the manifest.
pub fn policy_refs(paths: &[PathBuf]) -> Result<Vec<PolicyRef>, PipelineError> {
    paths
        .iter()
        .map(|p| {
            let limit = vsec::yaml::MAX_INPUT_BYTES as u64;
            let bytes =
                vse_base::read_input(p, limit).map_err(|error| PipelineError::PolicyRead {
                    path: p.clone(),
                    error,
                })?;
            let file = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            Ok(PolicyRef {
                file: file.display().to_string(),
                sha256: crate::fetch::sha256_hex(&bytes),
            })
        })
        .collect()
}

/// Spec + policies named by the lock (paths relative to the lock's directory), merged; they
/// must still give the environment the lock was made from. Also the policies' rules the
/// builder checks again after post-install commands.
fn locked_env(base: &Path, lock: &Lockfile) -> Result<(EffectiveEnv, Guard), PipelineError> {
    let spec_path = base.join(&lock.source.spec);
    let spec = vsec::spec::load(&spec_path).map_err(|error| PipelineError::LockedSpec {
        path: spec_path.clone(),
        error,
    })?;
    let policies = lock
        .source
        .policies
        .iter()
        .map(|p| {
            let path = base.join(p);
            vsec::policy::load(&path).map_err(|error| PipelineError::LockedPolicy { path, error })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let env = vsec::merge::merge(&spec, &policies)?;
    if env.env_hash() != lock.env_hash {
        return Err(PipelineError::EnvChanged {
            spec: spec_path,
            now: env.env_hash(),
            locked: lock.env_hash.clone(),
        });
    }
    let guard = guard_of(&env, &policies);
    Ok((env, guard))
}

/// The environment a lock is verified under when it is built without its spec: the smallest
/// one on the lock's suite and architecture, under `policies` (for `vse build`, those the lock
/// names, which cover the site's). The policies still decide the archives, keyrings,
/// forbidden and required packages.
pub(super) fn packages_only_env(
    base: &Path,
    lock: &Lockfile,
    lock_path: &Path,
    policies: Vec<vsec::policy::Policy>,
) -> Result<EffectiveEnv, PipelineError> {
    // These words go into YAML: only the characters Debian allows in suite and component
    // names, so a lock cannot add fields of its own.
    let word = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'+' | b'_'))
    };
    let bad = |what: String| PipelineError::LockWithoutEnv {
        path: lock_path.to_path_buf(),
        what,
    };
    let suites: Vec<&str> = lock.repositories.iter().map(|r| r.suite.as_str()).collect();
    let suite = suites
        .iter()
        .find(|s| !s.contains('-'))
        .or(suites.first())
        .map(|s| s.split('-').next().unwrap_or_default())
        .ok_or_else(|| bad("no repositories".into()))?;
    let mut components: Vec<&str> = Vec::new();
    for c in lock.repositories.iter().flat_map(|r| &r.components) {
        if !components.contains(&c.as_str()) {
            components.push(c);
        }
    }
    if let Some(w) = std::iter::once(&suite)
        .chain(&components)
        .find(|w| !word(w))
    {
        return Err(bad(format!("{w:?} is not a suite or component name")));
    }
    let yaml = format!(
        "version: 1\nname: packages-only\nbase:\n  distribution: debian\n  suite: {suite}\n  architecture: {}\n  components: [{}]\n  variant: essential\n",
        lock.architecture,
        components.join(", ")
    );
    let name = format!("<{}: packages only>", lock_path.display());
    let src = vsec::yaml::Source::from_bytes(
        &name,
        &base.join("packages-only.vse.yaml"),
        yaml.into_bytes(),
    );
    let spec = vsec::spec::parse_source(&src).map_err(PipelineError::Merge)?;
    Ok(vsec::merge::merge(&spec, &policies)?)
}

/// `files.protected` of the stacked policies and the environment's `packages.forbidden`, as
/// [`crate::customize::Customization::guard`] holds them.
pub fn guard_of(env: &EffectiveEnv, policies: &[vsec::policy::Policy]) -> Guard {
    let (stack, _) = vsec::merge::stack(policies);
    Guard {
        protected: stack
            .protected_paths
            .iter()
            .map(|p| Rule {
                value: p.value.to_string(),
                origin: p.at.to_string(),
            })
            .collect(),
        forbidden: env
            .forbidden
            .iter()
            .map(|f| Rule {
                value: f.value.to_string(),
                origin: f.from.to_string(),
            })
            .collect(),
    }
}

/// The environment's files, users, groups, variables and post-install commands, as the
/// builder applies them; policy files are kept apart (applied last, they win). Relative file
/// sources are read from `base`.
pub fn to_customization(env: &EffectiveEnv, base: &Path) -> Result<Customization, PipelineError> {
    let mut c = Customization::default();
    for f in &env.files {
        let entry = file_entry(env, &f.value, &f.from, base)?;
        match f.from {
            Origin::Policy { .. } => c.required_files.push(entry),
            _ => c.files.push(entry),
        }
    }
    c.groups = (env.groups.iter())
        .map(|g| GroupEntry {
            name: g.value.name.as_str().to_string(),
            gid: g.value.gid,
        })
        .collect();
    c.users = (env.users.iter())
        .map(|u| UserEntry {
            name: u.value.name.as_str().to_string(),
            uid: u.value.uid,
            groups: (u.value.groups.iter())
                .map(|g| g.as_str().to_string())
                .collect(),
            shell: u.value.shell.as_str().to_string(),
            home: u.value.home.as_str().to_string(),
        })
        .collect();
    c.env = env
        .environment
        .iter()
        .map(|e| (e.value.name.clone(), e.value.value.clone()))
        .collect();
    c.post_install = env.post_install.iter().map(|s| s.value.clone()).collect();
    Ok(c)
}

fn file_entry(
    env: &EffectiveEnv,
    v: &vsec::env::FileEntry,
    from: &Origin,
    base: &Path,
) -> Result<FileEntry, PipelineError> {
    let content = match &v.content {
        FileContent::Inline(s) => s.clone().into_bytes(),
        FileContent::Source(src) => {
            let abs = |p: &Path| {
                if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    base.join(p)
                }
            };
            let p = abs(&src.path);
            let read = match &src.beneath {
                Some(dir) => crate::customize::read_source(&abs(dir), &src.written),
                None => std::fs::read(&p),
            };
            read.map_err(|error| PipelineError::FileSource {
                file: v.path.to_string(),
                origin: from.to_string(),
                path: p.clone(),
                error,
            })?
        }
    };
    let unknown = |what: &'static str, n: &str| PipelineError::UnknownOwner {
        file: v.path.to_string(),
        origin: from.to_string(),
        what,
        name: n.to_string(),
    };
    let uid = if v.owner.as_str() == "root" {
        Some(0)
    } else {
        env.users
            .iter()
            .find(|u| u.value.name.as_str() == v.owner.as_str())
            .map(|u| u.value.uid)
    };
    let gid = if v.group.as_str() == "root" {
        Some(0)
    } else {
        env.groups
            .iter()
            .find(|g| g.value.name.as_str() == v.group.as_str())
            .map(|g| g.value.gid)
    };
    Ok(FileEntry {
        path: v.path.as_str().to_string(),
        content,
        mode: v.mode.bits(),
        uid: uid.ok_or_else(|| unknown("owner", v.owner.as_str()))?,
        gid: gid.ok_or_else(|| unknown("group", v.group.as_str()))?,
    })
}
