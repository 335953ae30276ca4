//! `vse attach --job ID`: takes over a running job whose `vse launch` died (killed, its node
//! rebooted its login shell…). The node agents keep the VMs for the grace period; this
//! becomes the job's front-end, prints the ranks' output from then on (and what the agents
//! held meanwhile), and exits with the job's status, as `vse launch` would have.

use super::launch::{Printer, run_dir};
use crate::exit::invalid;
use anyhow::Result;
use clap::Args;
use launcher::launch::{attach_blocking, record_path};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The job (`vse launch … --job ID`, or the name `vse status` shows).
    #[arg(long)]
    job: String,
    /// The job's state database. Default: the run directory's for the job.
    #[arg(long, env = "VSE_STATE_DB")]
    db: Option<PathBuf>,
    /// Print one JSON report at the end (the ranks' output in it).
    #[arg(long)]
    json: bool,
}

pub fn run(a: AttachArgs) -> Result<ExitCode> {
    let job = monitor::JobId::new(a.job.clone()).map_err(|e| invalid(format!("--job: {e}")))?;
    let place = a.db.clone().unwrap_or_else(run_dir);
    if let Some(exit) = super::owner::as_owner(&place, None)? {
        return Ok(exit);
    }
    let db = match a.db {
        Some(db) => db,
        None => newest_record_db(&job)?,
    };
    control::locate::reachable(&db).map_err(|e| invalid(e.to_string()))?;
    let mut out = Printer::new(a.json);
    let audit = super::audit::auditor(&[])?;
    let report = attach_blocking(&record_path(&db), Some(audit), |e| out.on(e))?;
    out.finish(&report)?;
    Ok(ExitCode::from(report.exit_code))
}

/// The job's database in the run directory: its first launch's, or a resumed launch's
/// (`<job>.r<pid>.state.db`), whichever has the newest attach record.
fn newest_record_db(job: &monitor::JobId) -> Result<PathBuf> {
    let dir = run_dir();
    let first = dir.join(format!("{job}.state.db"));
    let resumed = format!("{job}.r");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                    name.is_some_and(|n| {
                        n == format!("{job}.state.db.attach")
                            || (n.starts_with(&resumed) && n.ends_with(".state.db.attach"))
                    })
                })
                .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    Ok(found.pop().map_or(first, |(_, p)| p.with_extension("")))
}
