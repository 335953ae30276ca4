//! `vse checkpoint --job ID [--wait] [--json]`: asks a running job (launched with
//! `--checkpoint-dir`) to checkpoint now and run on. The request goes through the job's state
//! database; `--wait` follows it to its end and prints where the checkpoint went.

use super::request::{queue_error, waited};
use crate::exit::{Failure, invalid};
use anyhow::Result;
use clap::Args;
use control::state::{RequestState, StateDb};
use monitor::JobId;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vse_exit::{ErrorKind, Exit};

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The job (`vse launch … --job ID`).
    #[arg(long)]
    job: String,
    /// The job's state database. Default: the one of the run dir where the job runs.
    #[arg(long, env = "VSE_STATE_DB")]
    db: Option<PathBuf>,
    /// Wait until the checkpoint is complete (or failed).
    #[arg(long)]
    wait: bool,
    /// With --wait: the longest to wait, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

pub fn run(a: CheckpointArgs) -> Result<ExitCode> {
    let job = JobId::new(a.job.clone()).map_err(|e| invalid(format!("--job: {e}")))?;
    let place = a.db.clone().unwrap_or_else(super::launch::run_dir);
    let asked = vse_audit::Entry::allowed(vse_audit::Action::Checkpoint).job(job.as_str());
    if let Some(exit) = super::owner::as_owner(&place, Some(asked))? {
        return Ok(exit);
    }
    let located = control::locate::live_job(a.db.as_deref(), &super::launch::run_dir(), &job)
        .map_err(|e| Failure::new(ErrorKind::InvalidInput, e.to_string()).into());
    let entry = vse_audit::Entry::allowed(vse_audit::Action::Checkpoint)
        .job(job.as_str())
        .detail("requested (vse checkpoint)");
    let db_path = super::audit::record(&super::audit::auditor(&[])?, entry, located)?;
    let mut db = StateDb::open(&db_path)?;
    let id = db.request_checkpoint(&job).map_err(queue_error)?;
    let record = if a.wait {
        waited(db.wait_checkpoint(id, Duration::from_secs(a.timeout)))?
    } else {
        db.checkpoint_request(id)?
    };
    let exit = match record.state {
        RequestState::Failed | RequestState::NoSpare => Exit::NotCheckpointed,
        _ => Exit::Ok,
    };
    if a.json {
        let doc = serde_json::json!({ "db": db_path, "request": record, "exit_code": exit.code() });
        println!("{doc}");
        return Ok(exit.into());
    }
    let what = match record.state {
        RequestState::Done => format!("{} ({})", record.path, record.note),
        RequestState::Pending => "queued; the job takes it within a second".into(),
        _ => record.note.clone(),
    };
    let line = format!(
        "checkpoint {id} of job {job}: {}: {what}",
        record.state.as_str()
    );
    if exit == Exit::Ok {
        println!("{line}");
    } else {
        eprintln!("vse checkpoint: {line}");
    }
    Ok(exit.into())
}
