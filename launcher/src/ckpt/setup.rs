//! From `vse launch`'s flags and the stacked rules to what the launch does about checkpoints:
//! the checkpoint to resume (named by `--restore`, or found complete in `--checkpoint-dir`:
//! a requeued batch script that runs the same line resumes), and when to take new ones.

use super::schedule::{Walltime, WalltimeError};
use super::{Checkpoint, CheckpointDir, CkptError};
use crate::launch::CheckpointPlan;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vsec::env::{Checkpoint as Rules, CheckpointMode};

/// Where the checkpoints go when a policy requires them and the command line names no
/// directory: under the job's working directory, which batch systems share between nodes.
pub const DEFAULT_DIR: &str = "vse-checkpoints";

/// A `periodic` mode with no interval of its own (a policy's default mode).
const DEFAULT_EVERY: Duration = Duration::from_secs(3600);

/// The checkpoint this launch resumes, verified: `--restore`'s, else the newest complete one
/// in the checkpoint directory, else none.
pub fn resume_point(
    restore: Option<&Path>,
    dir: Option<&Path>,
) -> Result<Option<Checkpoint>, CkptError> {
    if let Some(r) = restore {
        return super::open(r).map(Some);
    }
    match dir.filter(|d| d.is_dir()) {
        Some(d) => CheckpointDir::create(d)?.latest(),
        None => Ok(None),
    }
}

/// What the launch's own checkpointing does, if anything: `None` when no directory is given
/// and no rule requires checkpoints.
pub fn plan(
    rules: &Rules,
    dir: Option<PathBuf>,
    job: &str,
    walltime: &Walltime,
    keep: usize,
) -> Result<Option<CheckpointPlan>, WalltimeError> {
    let required = rules.at_walltime_end.value || rules.mode.value != CheckpointMode::Never;
    let dir = match dir {
        Some(d) => d,
        None if required => Path::new(DEFAULT_DIR).join(job),
        None => return Ok(None),
    };
    let every = (rules.mode.value == CheckpointMode::Periodic).then(|| {
        let asked = rules
            .interval
            .as_ref()
            .map(|i| Duration::from_secs(i.value.get()));
        let min = rules
            .min_interval
            .as_ref()
            .map(|m| Duration::from_secs(m.value.get()));
        asked.unwrap_or(DEFAULT_EVERY).max(min.unwrap_or_default())
    });
    Ok(Some(CheckpointPlan {
        dir,
        end: walltime.end(Instant::now())?,
        at_walltime_end: rules.at_walltime_end.value,
        every,
        keep: keep.max(1),
        on_term: true,
    }))
}
