//! The job's host directories: `--share` arguments and the spec's `shares:` under the
//! policies' `shares.*`, resolved once, here, as the calling user (see `vsec::shares`).

use anyhow::Result;
use std::path::Path;
use std::sync::Arc;
use vse_guest_agent::share::server::{ShareSet, Shared};
use vsec::policy::Policy;
use vsec::shares::{ResolvedShare, ShareContext, ShareRequest, ShareRules};

/// The `shares.*` rules of the policy files `files`.
pub fn rules_of(files: &[std::path::PathBuf]) -> Result<ShareRules> {
    let policies = super::envload::load_policies(files)?
        .map_err(|d| super::envload::reported(&"the policies", d))?;
    rules_of_policies(&policies)
}

pub fn rules_of_policies(policies: &[Policy]) -> Result<ShareRules> {
    ShareRules::from_policies(policies).map_err(|d| super::envload::reported(&"the policies", d))
}

/// Resolves the default shares (unless `defaults` is false), the spec's `spec` and the
/// `--share` arguments `args` under `rules`.
pub fn resolve(
    mut rules: ShareRules,
    spec: Vec<ShareRequest>,
    args: &[String],
    defaults: bool,
) -> Result<Vec<ResolvedShare>> {
    if !defaults {
        rules.default.value.clear();
    }
    let mut asked = spec;
    for a in args {
        asked.push(vsec::shares::parse_share_arg(a)?);
    }
    let cx = ShareContext::from_process()
        .map_err(|e| anyhow::anyhow!("the job's directory and home: {e}"))?;
    Ok(vsec::shares::resolve(&asked, &rules, &cx)?)
}

/// The shares as a host end serves them (`None` when there are none).
pub fn serve(shares: &[ResolvedShare]) -> Result<Option<Arc<ShareSet>>> {
    if shares.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(ShareSet::open(&wire(shares))?)))
}

/// The shares as they travel to the nodes.
pub fn wire(shares: &[ResolvedShare]) -> Vec<Shared> {
    (shares.iter())
        .map(|s| Shared {
            host: s.host.clone(),
            guest: s.guest.clone(),
            ro: s.ro,
            optional: s.default,
        })
        .collect()
}

/// Where the command starts in the guest: the launch directory's place in a share, if one
/// holds it (else the user's home).
pub fn guest_cwd(shares: &[ResolvedShare], cwd: &Path) -> Option<String> {
    let cwd = cwd.canonicalize().ok()?;
    // The deepest share holding it: a share inside another is what the guest sees there.
    let s = (shares.iter())
        .filter(|s| cwd.starts_with(&s.host))
        .max_by_key(|s| s.host.components().count())?;
    let rest = cwd.strip_prefix(&s.host).ok()?;
    let mut g = std::path::PathBuf::from(&s.guest);
    g.push(rest);
    Some(g.to_str()?.to_string())
}
