//! Root acting on a user's job acts as that user. The job's state database, attach record and
//! sockets live in the user's run directory, which a root process must not open (its owner
//! could swap what is there for a link to any file); so root's `vse checkpoint`, `evacuate`,
//! `attach` or `status` of such a job runs again as a child with the owner's uid, gid and
//! groups, which the kernel then holds to the owner's rights.
//!
//! An admin who is not root acts through `sudo vse …`. When the site's policy names an admin
//! group (`authority.admin_group`), an ordinary user who reached root that way acts on
//! another user's job only as a member of that group, and the audit record names them.

use crate::exit::invalid;
use anyhow::{Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, ExitCode};

/// For root, when `place` (a state database or run directory) is in another user's
/// directory: this command's exit, having run as that user. `None`: go on here.
pub fn as_owner(place: &Path, audit: Option<vse_audit::Entry>) -> Result<Option<ExitCode>> {
    if vse_base::euid() != 0 {
        return Ok(None);
    }
    let Some(dir) = place.ancestors().find(|a| a.is_dir()) else {
        return Ok(None);
    };
    let uid = std::fs::metadata(dir)
        .with_context(|| format!("{}", dir.display()))?
        .uid();
    if uid == 0 {
        return Ok(None);
    }
    let pw = vse_base::account::passwd(uid).ok_or_else(|| {
        invalid(format!(
            "{} belongs to uid {uid}, which has no account here; hint: act on the job as its owner",
            dir.display()
        ))
    })?;
    let by = match sudo_caller() {
        Some(caller) if caller.uid != uid => {
            let group = match admin_member(&caller) {
                Ok(g) => g,
                Err(e) => {
                    let Some(entry) = audit else { return Err(e) };
                    let detail = format!("by {} (uid {}) through sudo", caller.name, caller.uid);
                    let aud = super::audit::auditor(&[])?;
                    return Err(super::audit::late_refusal(&aud, entry.detail(detail), e));
                }
            };
            let via = group.map_or(String::new(), |g| format!(", admin group {g}"));
            format!("by {} (uid {}) through sudo{via}", caller.name, caller.uid)
        }
        _ => "by root".to_string(),
    };
    if let Some(entry) = audit {
        let detail = format!("{by}, as the job's owner {} (uid {uid})", pw.name);
        super::audit::auditor(&[])?.log(entry.detail(detail))?;
    }
    eprintln!(
        "vse: {} is {}'s: acting as {} (uid {uid})",
        dir.display(),
        pw.name,
        pw.name
    );
    let mut c = Command::new(std::env::current_exe()?);
    c.args(std::env::args_os().skip(1))
        .env("HOME", &pw.home)
        .env("USER", &pw.name)
        .env("LOGNAME", &pw.name)
        // Root's cache is not the user's, and only root may choose the site directory.
        .env_remove("VSE_CACHE")
        .env_remove("VSE_SITE_DIR");
    pw.exec_as(&mut c);
    let status = c.status().context("running as the job's owner")?;
    let code = status.code().unwrap_or(1);
    Ok(Some(ExitCode::from(u8::try_from(code).unwrap_or(1))))
}

/// The ordinary user who ran this root process through `sudo` (its `SUDO_UID`). Only root can
/// give a root process that variable, so it is not a claim a user can forge.
fn sudo_caller() -> Option<vse_base::account::Passwd> {
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    (uid != 0).then(|| vse_base::account::passwd(uid)).flatten()
}

/// When the site names an admin group: the group, if `caller` is in it, else the refusal
/// (exit 2). `None`: the site names none, and sudo's grant is the site's word.
fn admin_member(caller: &vse_base::account::Passwd) -> Result<Option<String>> {
    let stack = super::site::policy_stack(&[])?;
    let st = stack
        .rules()
        .map_err(|problems| super::envload::reported(&stack.describe(), problems))?;
    let Some(group) = vsec::merge::admin_group(&st) else {
        return Ok(None);
    };
    let name = group.value.to_string();
    let gid = vse_base::account::group_id(&name);
    if gid.is_some_and(|g| caller.groups().contains(&g)) {
        return Ok(Some(name));
    }
    Err(invalid(format!(
        "{} (uid {}) ran vse through sudo, and acts on another user's job only as a member of the site's admin group `{name}` ({}); hint: an admin adds the account to it (usermod -aG {name} {}), or the job's owner acts on it",
        caller.name, caller.uid, group.at, caller.name
    )))
}
