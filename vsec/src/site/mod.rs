//! The site's own policies: the ones no command line can leave out.
//!
//! A site directory (default `/etc/vse`) holds `policy.d/*.policy.yaml`, stacked in name
//! order, then `partition.d/<partition>.policy.yaml` for the job's partition. Every command
//! that checks, locks, builds, imports or launches stacks them before any `--policy` the user
//! adds, so a user can narrow the site's rules but never drop one.
//!
//! Trust comes from ownership: the directory, its subdirectories and every policy file must
//! belong to root and be writable by nobody else, or the whole site is refused (a policy
//! anyone could edit is no policy). `VSE_SITE_DIR` moves the directory, for tests and for an
//! admin trying a policy; for anyone but root it is refused, since it would let a user
//! replace the site's rules with their own.

mod stack;

pub use stack::{PolicyStack, StackError, stack_files};

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const DEFAULT_SITE_DIR: &str = "/etc/vse";
const POLICY_SUFFIX: &str = ".policy.yaml";

/// Where the site's policies come from, as the process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteEnv {
    /// `VSE_SITE_DIR`, when set.
    pub dir_override: Option<PathBuf>,
    /// The effective user id of the process.
    pub euid: u32,
    /// The job's partition (Slurm) or queue (PBS), when running inside one.
    pub partition: Option<String>,
}

impl SiteEnv {
    /// Reads `VSE_SITE_DIR`, the effective uid and `SLURM_JOB_PARTITION` (or PBS's `PBS_QUEUE`).
    pub fn from_process() -> SiteEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        SiteEnv {
            dir_override: std::env::var_os("VSE_SITE_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            // SAFETY: geteuid has no preconditions and cannot fail.
            euid: unsafe { libc::geteuid() },
            partition: var("SLURM_JOB_PARTITION").or_else(|| var("PBS_QUEUE")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error(
        "VSE_SITE_DIR={}: only root may choose the site directory (you are uid {euid}); hint: unset VSE_SITE_DIR, the site's policies are in {DEFAULT_SITE_DIR}",
        .dir.display()
    )]
    OverrideNotRoot { dir: PathBuf, euid: u32 },
    #[error("site directory {}: {source}; hint: check VSE_SITE_DIR", .dir.display())]
    Missing {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: owned by uid {uid}, mode {mode:04o}: a site policy must be owned by root and writable by nobody else; hint: chown root:root and chmod go-w it",
        .path.display()
    )]
    Untrusted { path: PathBuf, uid: u32, mode: u32 },
    #[error(
        "{}: not a regular file or directory; hint: site policies are plain files in policy.d/ and partition.d/",
        .path.display()
    )]
    NotPlain { path: PathBuf },
    #[error(
        "partition `{0}` cannot name a policy file; hint: a partition name has letters, digits, `-`, `_` and `.`"
    )]
    BadPartition(String),
}

impl vse_exit::Classify for SiteError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// The site directory `env` names, if there is one (the default one may be absent).
fn site_dir(env: &SiteEnv) -> Result<Option<PathBuf>, SiteError> {
    Ok(match &env.dir_override {
        Some(d) if env.euid != 0 && d != Path::new(DEFAULT_SITE_DIR) => {
            return Err(SiteError::OverrideNotRoot {
                dir: d.clone(),
                euid: env.euid,
            });
        }
        Some(d) => {
            std::fs::metadata(d).map_err(|source| SiteError::Missing {
                dir: d.clone(),
                source,
            })?;
            Some(d.clone())
        }
        None if !Path::new(DEFAULT_SITE_DIR).exists() => None,
        None => Some(PathBuf::from(DEFAULT_SITE_DIR)),
    })
}

/// Does the site have partition policies (`partition.d/`)? Then the job's partition must be
/// known before its stack is.
pub fn has_partition_policies(env: &SiteEnv) -> Result<bool, SiteError> {
    match site_dir(env)? {
        Some(d) => exists(&d.join("partition.d")),
        None => Ok(false),
    }
}

/// The site's policy files in stacking order (empty when the default directory does not
/// exist: a site without policies).
pub fn site_policies(env: &SiteEnv) -> Result<Vec<PathBuf>, SiteError> {
    let Some(dir) = site_dir(env)? else {
        return Ok(vec![]);
    };
    trusted(&dir, true)?;
    let mut out = policy_files(&dir.join("policy.d"))?;
    if let Some(p) = &env.partition {
        let ok = !p.starts_with('.')
            && p.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
        if !ok {
            return Err(SiteError::BadPartition(p.clone()));
        }
        let part = dir.join("partition.d");
        let file = part.join(format!("{p}{POLICY_SUFFIX}"));
        if exists(&file)? {
            trusted(&part, true)?;
            trusted(&file, false)?;
            out.push(file);
        }
    }
    Ok(out)
}

/// Is `path` one of the site's policy files, as `env` sees the site: a file of its stack, or
/// the policy of any of its partitions (a process that builds for a job, such as the node's
/// spec build, may not know the job's partition; any partition's file is the admin's)? Such a
/// policy is the site's whoever names it; any other is a user's (`crate::policy::Layer`).
pub fn is_site_policy(path: &Path, env: &SiteEnv) -> bool {
    let Ok(p) = path.canonicalize() else {
        return false;
    };
    let listed = site_policies(env)
        .is_ok_and(|site| site.iter().any(|s| s.canonicalize().is_ok_and(|c| c == p)));
    let partition = || -> Result<bool, SiteError> {
        let Some(dir) = site_dir(env)? else {
            return Ok(false);
        };
        let part = dir.join("partition.d").canonicalize();
        let inside = part.is_ok_and(|d| p.parent() == Some(d.as_path()))
            && p.to_str().is_some_and(|n| n.ends_with(POLICY_SUFFIX));
        if inside {
            trusted(&dir, true)?;
            trusted(&dir.join("partition.d"), true)?;
            trusted(&p, false)?;
        }
        Ok(inside)
    };
    listed || partition().unwrap_or(false)
}

/// `*.policy.yaml` in `dir`, by name; none when `dir` does not exist.
fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, SiteError> {
    if !exists(dir)? {
        return Ok(vec![]);
    }
    trusted(dir, true)?;
    let read = |source| SiteError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = vec![];
    for e in std::fs::read_dir(dir).map_err(read)? {
        let path = e.map_err(read)?.path();
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(POLICY_SUFFIX) && !n.starts_with('.'));
        if named {
            trusted(&path, false)?;
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn exists(path: &Path) -> Result<bool, SiteError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SiteError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Root-owned and writable by root only; a symlink is judged by what it leads to, and so is
/// the directory holding that target (whoever can write there can swap the file).
fn trusted(path: &Path, dir: bool) -> Result<(), SiteError> {
    let real = std::fs::canonicalize(path).map_err(|source| SiteError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut check = vec![real.clone()];
    if !dir && let Some(parent) = real.parent() {
        check.push(parent.to_path_buf());
    }
    for p in check {
        let m = std::fs::metadata(&p).map_err(|source| SiteError::Read {
            path: p.clone(),
            source,
        })?;
        let plain = if p == real && !dir {
            m.is_file()
        } else {
            m.is_dir()
        };
        if !plain {
            return Err(SiteError::NotPlain {
                path: path.to_path_buf(),
            });
        }
        let mode = m.mode() & 0o7777;
        if m.uid() != 0 || mode & 0o022 != 0 {
            return Err(SiteError::Untrusted {
                path: p,
                uid: m.uid(),
                mode,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root_env(dir: &Path, partition: Option<&str>) -> SiteEnv {
        SiteEnv {
            dir_override: Some(dir.to_path_buf()),
            euid: 0,
            partition: partition.map(str::to_string),
        }
    }

    fn site() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["policy.d", "partition.d"] {
            std::fs::create_dir(t.path().join(d)).unwrap();
        }
        for f in [
            "policy.d/20-net.policy.yaml",
            "policy.d/10-base.policy.yaml",
            "policy.d/README",
            "partition.d/gpu.policy.yaml",
        ] {
            std::fs::write(t.path().join(f), "version: 1\nname: x\n").unwrap();
        }
        t
    }

    fn is_root() -> bool {
        testkit::require(
            testkit::is_root(),
            "root",
            "site policies must be root-owned; run the tests as root (CI does)",
        )
    }

    #[test]
    fn policies_stack_in_name_order_then_the_partition() {
        if !is_root() {
            return;
        }
        let t = site();
        let got = site_policies(&root_env(t.path(), Some("gpu"))).unwrap();
        let names: Vec<_> = got
            .iter()
            .map(|p| {
                p.strip_prefix(t.path())
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "policy.d/10-base.policy.yaml",
                "policy.d/20-net.policy.yaml",
                "partition.d/gpu.policy.yaml"
            ]
        );
        assert_eq!(
            site_policies(&root_env(t.path(), Some("cpu")))
                .unwrap()
                .len(),
            2
        );
        assert!(matches!(
            site_policies(&root_env(t.path(), Some("../x"))),
            Err(SiteError::BadPartition(_))
        ));
    }

    #[test]
    fn a_writable_directory_or_file_is_refused() {
        if !is_root() {
            return;
        }
        let t = site();
        let f = t.path().join("policy.d/10-base.policy.yaml");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = site_policies(&root_env(t.path(), None)).unwrap_err();
        assert!(matches!(e, SiteError::Untrusted { mode: 0o666, .. }), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = site_policies(&root_env(t.path(), None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode 0777") && e.contains("chmod go-w"), "{e}");
    }

    #[test]
    fn only_root_may_move_the_site() {
        let env = SiteEnv {
            dir_override: Some("/tmp/mine".into()),
            euid: 1000,
            partition: None,
        };
        let e = site_policies(&env).unwrap_err().to_string();
        assert!(e.starts_with("VSE_SITE_DIR=/tmp/mine: only root"), "{e}");
    }
}
