//! Root acting on a user's job acts as that user. The job's state database, attach record and
//! sockets live in the user's run directory, which a root process must not open (its owner
//! could swap what is there for a link to any file); so root's `vse checkpoint`, `evacuate`,
//! `attach` or `status` of such a job runs again as a child with the owner's uid, gid and
//! groups, which the kernel then holds to the owner's rights.

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
    if let Some(entry) = audit {
        let detail = format!("by root, as the job's owner {} (uid {uid})", pw.name);
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
        // Root's cache is not the user's.
        .env_remove("VSE_CACHE");
    pw.exec_as(&mut c);
    let status = c.status().context("running as the job's owner")?;
    let code = status.code().unwrap_or(1);
    Ok(Some(ExitCode::from(u8::try_from(code).unwrap_or(1))))
}
