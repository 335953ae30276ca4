//! The audit record of an `srun --vse` step (see `vse-audit`): the node service writes it
//! before it boots the step's VM, or when the request is refused, in the job user's name.

use crate::NodeArgs;
use std::path::PathBuf;
use vse_audit::{Action, Auditor, Entry, PolicyRef};
use vsec::site::{PolicyStack, SiteEnv};

/// The site's auditor, in the name of the job's user: the site directory's policies and those
/// plugstack.conf names (`site`). The site's stack only: its `audit.file` is the one that
/// counts, and a user's `--vse-policy` may not name another.
pub fn step_auditor(uid: u32, site: &[PathBuf]) -> Auditor {
    let stack = PolicyStack::load(&SiteEnv::from_process(), site, &[]).ok();
    let file = (stack.as_ref())
        .and_then(|s| s.rules().ok())
        .and_then(|st| vsec::merge::audit_file(&st))
        .map(|p| PathBuf::from(p.as_str()));
    let files = stack.map(|s| s.files).unwrap_or_default();
    Auditor::new(file, PolicyRef::of_files(&files)).for_user(uid)
}

/// The step's entry: its job (the step directory is `<job>.<step>.<node>`) and request.
pub fn step_entry(a: &NodeArgs) -> Entry {
    let name = a.dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let job = name
        .as_deref()
        .and_then(|n| n.split('.').next())
        .unwrap_or("");
    Entry::allowed(Action::Launch)
        .job(job)
        .detail(format!("srun --vse={}", a.request.image.trim()))
}
