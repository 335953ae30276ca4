//! Resolution on the host: every share asked for (and every default) made canonical, checked
//! as the calling user and against the rules.

use super::rules::{ShareRules, Verdict, judge};
use super::syntax::{guest_path, lexical};
use super::{ResolvedShare, ShareAt, ShareContext, ShareError, ShareRequest};
use crate::env::DefaultDir;
use crate::units::AbsPath;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The shares of one job: the defaults first, then `requests` in order. A request for a
/// default's guest path replaces that default; two requests for one guest path are an
/// error. Host paths are canonicalized here, once, so that a symlink or `..` can lead
/// nowhere the rules did not judge.
pub fn resolve(
    requests: &[ShareRequest],
    rules: &ShareRules,
    cx: &ShareContext,
) -> Result<Vec<ResolvedShare>, ShareError> {
    let mut asked: Vec<(ResolvedShare, &ShareAt)> = Vec::new();
    for r in requests {
        let s = one(&r.host, r.guest.as_deref(), r.ro, &r.at, false, rules, cx)?;
        if let Some((_, first)) = asked.iter().find(|(a, _)| a.guest == s.guest) {
            return Err(ShareError::SameGuest {
                at: r.at.clone(),
                guest: s.guest,
                first: (*first).clone(),
            });
        }
        asked.push((s, &r.at));
    }
    let mut out: Vec<ResolvedShare> = Vec::new();
    for d in &rules.default.value {
        let at = ShareAt::Default(d.from.clone());
        let host = match &d.value.dir {
            DefaultDir::Cwd => cx.cwd.clone(),
            DefaultDir::Home => cx.home.clone(),
            DefaultDir::Path(p) => PathBuf::from(p.as_str()),
        };
        // A request for its guest path replaces it unjudged; the user launching from their
        // home gets it once.
        let taken = |g: &str| {
            out.iter()
                .chain(asked.iter().map(|(a, _)| a))
                .any(|o| o.guest == g)
        };
        if taken(&lexical(&host).to_string_lossy()) {
            continue;
        }
        let host = host.to_string_lossy();
        let s = match one(&host, None, d.value.ro, &at, true, rules, cx) {
            Ok(s) => s,
            Err(e) if d.value.dir == DefaultDir::Cwd && e.is_refusal() => continue,
            Err(e) => return Err(e),
        };
        if !taken(&s.guest) {
            out.push(s);
        }
    }
    out.extend(asked.into_iter().map(|(s, _)| s));
    Ok(out)
}

fn one(
    host: &str,
    guest: Option<&str>,
    ro: bool,
    at: &ShareAt,
    default: bool,
    rules: &ShareRules,
    cx: &ShareContext,
) -> Result<ResolvedShare, ShareError> {
    let invalid = |e| ShareError::invalid(at.clone(), e);
    let host = super::host_path(host).map_err(invalid)?;
    let expanded = expand(&host, cx);
    let guest = match guest {
        Some(g) => guest_path(g),
        None => guest_path(&lexical(&expanded).to_string_lossy()),
    }
    .map_err(invalid)?;
    let canonical = std::fs::canonicalize(&expanded).map_err(|e| match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => ShareError::Missing {
            at: at.clone(),
            host: expanded.clone(),
        },
        _ => ShareError::Unreadable {
            at: at.clone(),
            host: expanded.clone(),
            reason: e.to_string(),
        },
    })?;
    if !canonical.is_dir() {
        return Err(ShareError::NotADirectory {
            at: at.clone(),
            host: canonical,
        });
    }
    if let Err(e) = readable(&canonical) {
        return Err(ShareError::Unreadable {
            at: at.clone(),
            host: canonical,
            reason: e.to_string(),
        });
    }
    let ro = match judge(&canonical, ro, rules, &forms) {
        Verdict::Ok { ro } => ro,
        // An admin's default under a read-only entry is shared read-only, not refused.
        Verdict::ReadOnly(_) if default => true,
        Verdict::ReadOnly(a) => {
            return Err(ShareError::ReadOnly {
                at: at.clone(),
                host: canonical,
                prefix: a.value.path.to_string(),
                rule: Box::new(a.from.clone()),
            });
        }
        Verdict::Forbidden(f) => {
            return Err(ShareError::Forbidden {
                at: at.clone(),
                host: canonical,
                prefix: f.value.to_string(),
                rule: Box::new(f.from.clone()),
            });
        }
        Verdict::NotAllowed => {
            let allowed = rules.allowed.as_ref().expect("judged against a list");
            return Err(ShareError::NotAllowed {
                at: at.clone(),
                host: canonical,
                allowed: rules.allowed_list(),
                rule: Box::new(allowed.from.clone()),
            });
        }
    };
    Ok(ResolvedShare {
        host: canonical,
        guest: guest.to_string(),
        ro,
        default,
    })
}

/// `~`, `~/x`, relative to the launch directory, or as is.
fn expand(host: &str, cx: &ShareContext) -> PathBuf {
    match host.strip_prefix('~') {
        Some(rest) => cx.home.join(rest.trim_start_matches('/')),
        None => cx.cwd.join(host),
    }
}

/// A rule's prefix as written and, when it exists, canonical: a symlinked prefix must
/// still hold (allowed) or catch (forbidden) what lies beneath its target.
fn forms(prefix: &AbsPath) -> Vec<PathBuf> {
    let written = PathBuf::from(prefix.as_str());
    match std::fs::canonicalize(&written) {
        Ok(c) if c != written => vec![written, c],
        _ => vec![written],
    }
}

/// Whether the calling user may list and enter `dir`, by the kernel's own check (ACLs and
/// all), so that a share never gives the job what its user cannot read on the host.
fn readable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; access(2) only
    // reads it.
    if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::X_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
