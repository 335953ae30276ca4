//! `vse launch`'s checkpoint flags: where checkpoints go, what to resume, the walltime of
//! allocations that have none of their own; mapped to the launcher's checkpoint setup.

use crate::exit::invalid;
use anyhow::Result;
use clap::Args;
use launcher::ckpt::{Checkpoint, Walltime, setup};
use launcher::launch::CheckpointPlan;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CheckpointFlags {
    /// Job checkpoints go here (every node must see it at the same path: shared storage).
    /// A complete checkpoint found here is resumed: a requeued batch script that runs the
    /// same line continues where it stopped. Checkpoints are taken on SIGTERM (preemption),
    /// on `vse checkpoint --job ID`, before the walltime ends and periodically when the spec
    /// or a policy says so; a job that completes removes them.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Resume the job saved in this checkpoint (a --checkpoint-dir, or one ckpt-N in it);
    /// the command, sizes and network come from the checkpoint.
    #[arg(long, value_name = "DIR")]
    pub restore: Option<PathBuf>,
    /// The allocation's time limit from now, e.g. `30m`, for allocations without one of
    /// their own (local, hostfile); Slurm's and PBS's come from the batch system.
    #[arg(long, value_name = "DURATION", value_parser = parse_walltime)]
    pub walltime: Option<Duration>,
    /// Complete checkpoints kept in --checkpoint-dir (older ones are removed).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub keep_checkpoints: usize,
}

fn parse_walltime(s: &str) -> Result<Duration, String> {
    vsec::units::Seconds::parse(s)
        .map(|d| Duration::from_secs(d.get()))
        .map_err(|e| e.to_string())
}

impl CheckpointFlags {
    /// The verified checkpoint to resume, if any (a damaged one is refused: exit 2).
    pub fn resume_point(&self) -> Result<Option<Checkpoint>> {
        let ck = setup::resume_point(self.restore.as_deref(), self.checkpoint_dir.as_deref())?;
        if let (Some(c), None) = (&ck, &self.restore) {
            eprintln!(
                "vse launch: resuming from checkpoint {} ({}, taken {} s ago)",
                c.dir.display(),
                c.manifest.reason.as_str(),
                control::state::now_ms_u64().saturating_sub(c.manifest.taken_ms) / 1000
            );
        }
        Ok(ck)
    }

    /// The launch's checkpointing under `rules`.
    pub fn plan(
        &self,
        rules: &vsec::env::Checkpoint,
        allocation: &str,
        job: &str,
    ) -> Result<Option<CheckpointPlan>> {
        let walltime = match (self.walltime, allocation) {
            (Some(d), _) => Walltime::Given(d),
            (None, "slurm") => {
                std::env::var("SLURM_JOB_ID").map_or(Walltime::None, Walltime::Slurm)
            }
            (None, "pbs") => std::env::var("PBS_JOBID").map_or(Walltime::None, Walltime::Pbs),
            (None, _) => Walltime::None,
        };
        let plan = setup::plan(rules, self.dir(), job, &walltime, self.keep_checkpoints)?;
        if let Some(p) = &plan
            && p.at_walltime_end
            && p.end.is_none()
        {
            // A site's rule that jobs are saved before their end cannot be kept without the
            // end: the job would be killed unsaved.
            if let vsec::env::Origin::Policy { at } = &rules.at_walltime_end.from {
                return Err(invalid(format!(
                    "{at}: checkpoint.at_walltime_end requires a checkpoint before the allocation ends, but vse cannot learn this allocation's end; hint: give --walltime, or launch inside a Slurm or PBS job"
                )));
            }
            eprintln!(
                "vse launch: checkpoint at walltime end asked for, but the allocation's end is unknown; hint: give --walltime"
            );
        }
        if plan.is_some() && self.dir().is_none() {
            eprintln!(
                "vse launch: a policy requires checkpoints: they go to {}",
                plan.as_ref()
                    .map_or_else(String::new, |p| p.dir.display().to_string())
            );
        }
        Ok(plan)
    }

    /// Where this launch's checkpoints go: --checkpoint-dir, else the directory of the
    /// checkpoint it resumes.
    fn dir(&self) -> Option<PathBuf> {
        self.checkpoint_dir.clone().or_else(|| {
            let r = self.restore.as_ref()?;
            match r.join(launcher::ckpt::MANIFEST).exists() {
                true => r.parent().map(PathBuf::from),
                false => Some(r.clone()),
            }
        })
    }

    /// A restored job keeps its name: its VMs' names and barrier identities live on in the
    /// guests.
    pub fn job_name(&self, given: Option<&str>, ck: &Checkpoint) -> Result<String> {
        let name = &ck.manifest.job;
        match given {
            Some(g) if g != name => Err(invalid(format!(
                "--job {g}: the checkpoint is of job {name}, and a restored job keeps its name; hint: drop --job"
            ))),
            _ => Ok(name.clone()),
        }
    }
}
