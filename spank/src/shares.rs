//! `--vse-share=HOST[:GUEST][:ro][,…]` and a spec's `shares:` for `srun --vse`: checked with
//! the user's privileges in srun (before anything starts), and resolved again on the node by
//! the step's service once it has become the job's user, which then serves them to the VM.

use crate::SpankError;
use std::path::Path;
use vse_guest_agent::share::server::{ShareSet, Shared};
use vsec::env::EffectiveEnv;
use vsec::shares::{ResolvedShare, ShareContext, ShareError, ShareRequest, ShareRules};

/// What a step asks to share, and the rules that judge it.
#[derive(Debug, Clone, Default)]
pub struct StepShares {
    pub requests: Vec<ShareRequest>,
    pub rules: ShareRules,
}

/// The step's shares: the spec's (`env`, for `--vse=SPEC`), then `--vse-share`'s, under the
/// stacked policies `stack`.
pub fn requested(
    arg: Option<&str>,
    env: Option<&EffectiveEnv>,
    stack: &vsec::merge::Stack,
) -> Result<StepShares, SpankError> {
    let (mut requests, rules) = match env {
        Some(env) => (vsec::shares::spec_requests(env), ShareRules::from_env(env)),
        None => (
            Vec::new(),
            ShareRules::from_policy(&vsec::merge::share_policy(stack)),
        ),
    };
    for one in arg.into_iter().flat_map(|a| a.split(',')) {
        let one = one.trim();
        if !one.is_empty() {
            requests.push(vsec::shares::parse_share_arg(one).map_err(refused)?);
        }
    }
    Ok(StepShares { requests, rules })
}

/// Resolves the step's shares from the task's directory `cwd` and the user's `home`, with
/// this process's privileges (the user's: srun's, or the node service's after its drop).
pub fn resolve(s: &StepShares, cwd: &Path, home: &Path) -> Result<Vec<ResolvedShare>, SpankError> {
    let cx = ShareContext {
        cwd: cwd.to_path_buf(),
        home: home.to_path_buf(),
    };
    vsec::shares::resolve(&s.requests, &s.rules, &cx).map_err(refused)
}

/// Opens the resolved shares for the VM's link (as this process's user).
pub fn open(resolved: Vec<ResolvedShare>) -> Result<ShareSet, SpankError> {
    let list: Vec<Shared> = (resolved.into_iter())
        .map(|s| Shared {
            host: s.host,
            guest: s.guest,
            ro: s.ro,
            optional: s.default,
        })
        .collect();
    ShareSet::open(&list).map_err(SpankError::io("opening the step's shares"))
}

/// A refusal, worded for the Slurm option the user typed.
fn refused(e: ShareError) -> SpankError {
    SpankError::Invalid(e.to_string().replacen("--share ", "--vse-share=", 1))
}
