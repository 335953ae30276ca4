//! `vse evacuate NODE [--job ID] [--mode live] [--wait] [--json]`: asks a running job's
//! controller to move every VM of the job off NODE to spare nodes (live, at a barrier for
//! ranks that use one) and mark the node defunct. The request goes through the job's state
//! database; `--wait` follows it to its end.

use super::request::{queue_error, waited};
use crate::exit::{Failure, invalid};
use anyhow::Result;
use clap::{Args, ValueEnum};
use control::state::{RequestState, StateDb};
use monitor::{JobId, NodeName};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vse_exit::{ErrorKind, Exit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Live migration: the job keeps running.
    Live,
    /// Checkpoint the VMs and restore them elsewhere: not offered (refused); checkpoint the
    /// job (`vse checkpoint`) and restore it (`vse launch … --restore DIR`) on other nodes instead.
    Checkpoint,
}

#[derive(Debug, Args)]
pub struct EvacuateArgs {
    /// The node to empty, as the job names it (`vse status` lists the job's nodes).
    node: String,
    /// The job (`vse launch … --job ID`); default: the one running job that has NODE.
    #[arg(long)]
    job: Option<String>,
    /// The job's state database. Default: $VSE_STATE_DB, else `<run dir>/<job>.state.db`, else
    /// every `*.state.db` of the run dir.
    #[arg(long, env = "VSE_STATE_DB")]
    db: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "live")]
    mode: Mode,
    /// Wait until every VM has moved (or the evacuation failed).
    #[arg(long)]
    wait: bool,
    /// With --wait: the longest to wait, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

pub fn run(a: EvacuateArgs) -> Result<ExitCode> {
    if a.mode == Mode::Checkpoint {
        return Err(invalid(
            "--mode checkpoint: not offered; hint: use --mode live, or `vse checkpoint --job ID` and `vse launch IMAGE --restore DIR` on other nodes",
        ));
    }
    let node = NodeName::new(a.node.clone()).map_err(|e| invalid(format!("NODE: {e}")))?;
    let place = a.db.clone().unwrap_or_else(super::launch::run_dir);
    let mut asked = vse_audit::Entry::allowed(vse_audit::Action::Evacuation);
    asked.job = a.job.clone();
    if let Some(exit) = super::owner::as_owner(&place, Some(asked))? {
        return Ok(exit);
    }
    let job = (a.job.as_deref().map(JobId::new).transpose())
        .map_err(|e| invalid(format!("--job: {e}")))?;
    let located = control::locate::running_job(
        a.db.as_deref(),
        &super::launch::run_dir(),
        job.as_ref(),
        &node,
    )
    .map_err(|e| Failure::new(ErrorKind::InvalidInput, e.to_string()).into());
    let mut entry = vse_audit::Entry::allowed(vse_audit::Action::Evacuation)
        .detail(format!("node {node} (vse evacuate)"));
    entry.job = (located.as_ref().ok().map(|(_, j)| j.to_string()))
        .or_else(|| job.as_ref().map(|j| j.to_string()));
    let (db_path, job) = super::audit::record(&super::audit::auditor(&[])?, entry, located)?;
    let mut db = StateDb::open(&db_path)?;
    // An unknown job or node is the caller's mistake; a database failure is not.
    let id = db.request_evacuation(&job, &node).map_err(queue_error)?;
    let record = if a.wait {
        waited(db.wait_request(id, Duration::from_secs(a.timeout)))?
    } else {
        db.request(id)?
    };
    let exit = match record.state {
        RequestState::Pending | RequestState::Running | RequestState::Done => Exit::Ok,
        RequestState::NoSpare => Exit::NoCapacity,
        RequestState::Failed => Exit::NotMoved,
    };
    if a.json {
        let doc = serde_json::json!({ "db": db_path, "request": record, "exit_code": exit.code() });
        println!("{doc}");
    } else {
        let note = if record.note.is_empty() {
            "queued; `vse status` follows it".into()
        } else {
            record.note.clone()
        };
        let line = format!(
            "evacuation {id} of {node} (job {job}): {}: {note}",
            record.state.as_str()
        );
        if exit == Exit::Ok {
            println!("{line}")
        } else {
            eprintln!("vse evacuate: {line}")
        }
    }
    Ok(exit.into())
}
