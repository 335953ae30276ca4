//! The node service joins its step's cgroups, so that the VM it starts is the job's: bounded
//! by the job's memory limit, accounted by `jobacct_gather/cgroup` (`sstat`, `sacct`), frozen
//! and killed with the step by `proctrack/cgroup`.
//!
//! slurmstepd forks the service before the tasks exist and leaves it in slurmstepd's own
//! cgroups (v1: the job's freezer cgroup, the machine's memory cgroup). The cgroups Slurm gives
//! the tasks are read from the first task that connects (its pid from `SO_PEERCRED`), as root,
//! before the service drops to the user. That task must be inside the job's own cgroup of
//! the process-tracking hierarchy (v1 freezer, v2 unified) where slurmstepd placed this
//! service: any other process of the user, and a recycled pid, fails that test.

use crate::SpankError;
use std::path::PathBuf;
use vse_base::cgroup::{CgroupLine, cgroup_dir, parse_cgroups};

/// Moves this process into every cgroup of `task` that differs from its own; returns the
/// directories joined (none when the cluster does not track jobs with cgroups).
pub(crate) fn join_task(task: u32) -> Result<Vec<PathBuf>, SpankError> {
    let read =
        |p: String| std::fs::read_to_string(&p).map_err(SpankError::io(format!("reading {p}")));
    let own = parse_cgroups(&read("/proc/self/cgroup".into())?);
    let peer = parse_cgroups(&read(format!("/proc/{task}/cgroup"))?);
    let mountinfo = read("/proc/self/mountinfo".into())?;
    let targets = plan(&own, &peer, task)?;
    let mut joined = Vec::new();
    for line in targets {
        let dir = cgroup_dir(line, &mountinfo).ok_or_else(|| {
            SpankError::Node(format!(
                "task {task}'s cgroup {}:{} is not mounted here",
                line.controllers.join(","),
                line.path
            ))
        })?;
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .map_err(SpankError::io(format!("joining {}", dir.display())))?;
        joined.push(dir);
    }
    Ok(joined)
}

/// The task's cgroups to join, once the task is shown to be of this job.
fn plan<'a>(
    own: &[CgroupLine],
    peer: &'a [CgroupLine],
    task: u32,
) -> Result<Vec<&'a CgroupLine>, SpankError> {
    let same = |o: &CgroupLine, p: &CgroupLine| o.id == p.id && o.controllers == p.controllers;
    let tracking = |l: &CgroupLine| l.controllers == ["freezer"] || l.id == "0";
    let anchors: Vec<&CgroupLine> = own
        .iter()
        .filter(|l| tracking(l) && l.path != "/")
        .collect();
    if anchors.is_empty() {
        return Ok(Vec::new());
    }
    for a in &anchors {
        // v2: slurmstepd sits in `…/step_N/slurm_processes`, the tasks in `…/step_N/user/…`.
        let base = match a.path.strip_suffix("/slurm_processes") {
            Some(step) => step,
            None => a.path.as_str(),
        };
        let inside = peer
            .iter()
            .find(|p| same(a, p))
            .is_some_and(|p| p.path.starts_with(&format!("{base}/")));
        if !inside {
            return Err(SpankError::Invalid(format!(
                "process {task} is not a task of this step (its cgroups are not inside {base})"
            )));
        }
    }
    Ok(peer
        .iter()
        .filter(|p| !own.iter().any(|o| same(o, p) && o.path == p.path))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str =
        "6:freezer:/slurm_n2/uid_0/job_251\n4:memory:/machine\n2:cpuacct:/\n1:cpu:/\n0::/\n";
    const TASK: &str = "6:freezer:/slurm_n2/uid_0/job_251/step_0\n4:memory:/slurm_n2/uid_0/job_251/step_0/task_0\n2:cpuacct:/slurm_n2/uid_0/job_251/step_0/task_0\n1:cpu:/\n0::/\n";

    fn paths(v: Vec<&CgroupLine>) -> Vec<String> {
        v.iter().map(|l| l.path.clone()).collect()
    }

    #[test]
    fn the_service_joins_the_task_s_freezer_memory_and_cpuacct_cgroups() {
        let own = parse_cgroups(SERVICE);
        let peer = parse_cgroups(TASK);
        assert_eq!(
            paths(plan(&own, &peer, 7).unwrap()),
            [
                "/slurm_n2/uid_0/job_251/step_0",
                "/slurm_n2/uid_0/job_251/step_0/task_0",
                "/slurm_n2/uid_0/job_251/step_0/task_0"
            ]
        );
    }

    #[test]
    fn a_process_outside_the_job_is_refused() {
        let own = parse_cgroups(SERVICE);
        let other = TASK.replace("job_251", "job_9");
        let e = plan(&own, &parse_cgroups(&other), 7).unwrap_err();
        assert!(e.to_string().contains("not a task of this step"), "{e}");
        // The job's own cgroup is not one of its steps'.
        let job = parse_cgroups("6:freezer:/slurm_n2/uid_0/job_251\n");
        assert!(plan(&own, &job, 7).is_err());
    }

    #[test]
    fn without_cgroup_tracking_nothing_is_joined() {
        let own = parse_cgroups("6:freezer:/\n4:memory:/machine\n0::/\n");
        assert!(plan(&own, &parse_cgroups(TASK), 7).unwrap().is_empty());
    }

    #[test]
    fn v2_steps_keep_slurmstepd_and_tasks_apart() {
        let own = parse_cgroups("0::/system.slice/slurmstepd.scope/job_4/step_0/slurm_processes\n");
        let peer = parse_cgroups("0::/system.slice/slurmstepd.scope/job_4/step_0/user/task_0\n");
        assert_eq!(
            paths(plan(&own, &peer, 7).unwrap()),
            ["/system.slice/slurmstepd.scope/job_4/step_0/user/task_0"]
        );
    }
}
