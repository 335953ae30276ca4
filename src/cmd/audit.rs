//! `vse audit [--job ID] [--user U] [--action A] [--file F] [--json]`: the audit records of
//! the site's file (its policy's `audit.file`) or of a syslog file; and the record every
//! audited command writes before it acts ([`record`]).

use crate::exit::is_invalid;
use anyhow::Result;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vse_audit::{Action, Auditor, Entry, Filter, PolicyRef};

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vse audit --job 4711                 every record of job 4711
  vse audit --user alice --action launch --json
  vse audit --file /var/log/auth.log   the records syslog kept")]
pub struct AuditArgs {
    /// Only records of this job.
    #[arg(long)]
    job: Option<String>,
    /// Only records of this user (name or uid).
    #[arg(long)]
    user: Option<String>,
    /// Only records of this action: build, import, sign, launch, checkpoint, restore,
    /// migration, evacuation.
    #[arg(long)]
    action: Option<Action>,
    /// Read this file (the site's audit file, or a syslog file) instead of the site
    /// policy's `audit.file`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Print one JSON document: {"file", "records": […], "unreadable"}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: AuditArgs) -> Result<ExitCode> {
    let file = match a.file {
        Some(f) => f,
        None => auditor(&[])?.file().map(Path::to_path_buf).ok_or_else(|| {
            crate::exit::invalid(
                "no audit file: the site's policies set no audit.file; hint: name one with --file (a syslog file keeps every record, tagged vse-audit)",
            )
        })?,
    };
    let filter = Filter {
        job: a.job,
        user: a.user,
        action: a.action,
    };
    let scan = vse_audit::scan(&file, &filter)?;
    if a.json {
        let doc = serde_json::json!({
            "file": file, "records": scan.records, "unreadable": scan.unreadable,
        });
        println!("{doc}");
        return Ok(ExitCode::SUCCESS);
    }
    for r in &scan.records {
        println!("{r}");
    }
    if scan.unreadable > 0 {
        eprintln!(
            "vse audit: {} line(s) of {} are not audit records",
            scan.unreadable,
            file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The auditor of a command under the site's policies, then `user` (paths): its records name
/// the stack's files and digests and go to the stack's `audit.file`.
pub fn auditor(user: &[PathBuf]) -> Result<Auditor> {
    // A stack the user's policies break is refused by the action's own check, whose refusal
    // goes to the site's file: the site's own stack names it then.
    let env = vsec::site::SiteEnv::from_process();
    let full = (vsec::site::PolicyStack::load(&env, &[], user).ok()).filter(|s| s.rules().is_ok());
    let stack = match full {
        Some(s) => s,
        None => super::site::policy_stack(&[])?,
    };
    let st = stack
        .rules()
        .map_err(|problems| super::envload::reported(&stack.describe(), problems))?;
    let file = vsec::merge::audit_file(&st).map(|p| PathBuf::from(p.as_str()));
    let files = super::site::stacked(user).unwrap_or_else(|_| stack.files.clone());
    Ok(Auditor::new(file, PolicyRef::of_files(&files)))
}

/// Writes the record of an action's admission check before the action: refused (the error's
/// text names the rule and the policy line) when `checked` failed on the input, else allowed.
/// A record that cannot be written refuses the action.
pub fn record<T>(aud: &Auditor, entry: Entry, checked: Result<T>) -> Result<T> {
    match checked {
        Ok(v) => {
            aud.log(entry)?;
            Ok(v)
        }
        Err(e) => Err(late_refusal(aud, entry, e)),
    }
}

/// Records `e` as the refusal of `entry`'s action when it is the input's fault (a rule, a
/// policy line); returns `e`. Also for a rule the action itself found broken after its
/// admission (a `post_install` command that wrote under `files.protected`).
pub fn late_refusal(aud: &Auditor, entry: Entry, e: anyhow::Error) -> anyhow::Error {
    if is_invalid(&e) {
        let refused = Entry {
            outcome: vse_audit::Outcome::Refused,
            rule: Some(format!("{e:#}")),
            ..entry
        };
        // The refusal stands either way; the user's error is the one to report.
        if let Err(w) = aud.log(refused) {
            eprintln!("vse: {w}");
        }
    }
    e
}
