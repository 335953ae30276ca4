//! The policy stack of one request, built one way for every path: `vse check`, `lock`,
//! `build`, `import`, `run`, `launch`, and the SPANK plugin's check (srun, sbatch) and node
//! service. The site's files come first (its directory's `policy.d/`, the partition's
//! `partition.d/` file, then files a privileged configuration adds, such as plugstack.conf's
//! `policy=`), then the user's; the site's are marked as the site's, so a user's policy can
//! narrow them but never choose what they trust (`crate::policy::MergeRule`).

use super::{SiteEnv, SiteError, site_policies};
use crate::env::EffectiveEnv;
use crate::launch::LaunchRules;
use crate::merge::Stack;
use crate::policy::Policy;
use crate::spec::Spec;
use crate::yaml::{Diagnostics, YamlError};
use std::path::{Path, PathBuf};

/// A loaded policy stack: its files in stacking order and each file's policy.
#[derive(Debug, Clone)]
pub struct PolicyStack {
    pub files: Vec<PathBuf>,
    pub policies: Vec<Policy>,
    /// How many of the files are the site's (they come first).
    pub n_site: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Site(#[from] SiteError),
    /// A policy file could not be read.
    #[error(transparent)]
    Read(YamlError),
    /// Every problem of the policies' contents and of their stacking.
    #[error("{0}")]
    Invalid(Diagnostics),
}

impl vse_exit::Classify for StackError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// The files of a stack, site first: the site directory's as `env` sees it, then `site_extra`
/// (the site's own configuration names them), then the user's (a file already in the site's
/// part is not stacked twice). Commands that pass policy paths on (a lockfile records them)
/// take this list; loading it with [`PolicyStack::load`] or file by file with
/// [`crate::policy::load`] marks the same files as the site's.
pub fn stack_files(
    env: &SiteEnv,
    site_extra: &[PathBuf],
    user: &[PathBuf],
) -> Result<(Vec<PathBuf>, usize), SiteError> {
    let mut all = site_policies(env)?;
    all.extend(site_extra.iter().cloned());
    let n_site = all.len();
    let seen: Vec<PathBuf> = all.iter().filter_map(|p| p.canonicalize().ok()).collect();
    all.extend(
        user.iter()
            .filter(|p| p.canonicalize().map_or(true, |c| !seen.contains(&c)))
            .cloned(),
    );
    Ok((all, n_site))
}

impl PolicyStack {
    /// Reads the stack of [`stack_files`]. Every content problem of every file is collected;
    /// an unreadable file ends the load.
    pub fn load(
        env: &SiteEnv,
        site_extra: &[PathBuf],
        user: &[PathBuf],
    ) -> Result<PolicyStack, StackError> {
        let (files, n_site) = stack_files(env, site_extra, user)?;
        let mut problems = Diagnostics::default();
        let mut policies = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            match load_one(f, env, i < n_site) {
                Ok(p) => policies.push(p),
                Err(YamlError::Invalid(d)) => problems.extend(d),
                Err(e) => return Err(StackError::Read(e)),
            }
        }
        if !problems.is_empty() {
            return Err(StackError::Invalid(problems));
        }
        Ok(PolicyStack {
            files,
            policies,
            n_site,
        })
    }

    /// The combined rules, or every problem of the stacking.
    pub fn rules(&self) -> Result<Stack, Diagnostics> {
        let (st, d) = crate::merge::stack(&self.policies);
        d.into_result(st)
    }

    /// A spec under this stack: `vse check`'s effective environment.
    pub fn merge(&self, spec: &Spec) -> Result<EffectiveEnv, Diagnostics> {
        crate::merge::merge(spec, &self.policies)
    }

    /// What a launch of an image must obey (limits, hypervisors, network...).
    pub fn launch_rules(&self) -> Result<LaunchRules, Diagnostics> {
        LaunchRules::from_policies(&self.policies)
    }

    /// The files, joined for messages (`a + b`).
    pub fn describe(&self) -> String {
        let names: Vec<_> = self.files.iter().map(|p| p.display().to_string()).collect();
        names.join(" + ")
    }

    /// The site's files of the stack.
    pub fn site_files(&self) -> &[PathBuf] {
        &self.files[..self.n_site]
    }
}

fn load_one(path: &Path, env: &SiteEnv, site: bool) -> Result<Policy, YamlError> {
    let p = crate::policy::load_as(path, env)?;
    Ok(if site { p.site() } else { p })
}
