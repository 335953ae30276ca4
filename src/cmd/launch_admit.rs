//! What `vse launch` checks before it starts anything: the policies' rules for this job
//! (sizes, hypervisor, guest root, shares, attach grace, checkpoints) and the image's admission, a spec
//! built first. Its outcome is the job's audit record (`launch` or `restore`).

use super::launch::LaunchArgs;
use anyhow::Result;
use control::migrate::MigrationConfig;
use launcher::launch::Sizes;
use std::time::Duration;
use vse_guest_agent::share::server::Shared;
use vsec::{env::EffectiveEnv, launch::LaunchRules, units::Hypervisor};

/// Everything the launch needs from its checks.
pub struct Admitted {
    pub rules: LaunchRules,
    pub shares: Vec<Shared>,
    pub cwd: Option<String>,
    pub sizes: Sizes,
    pub grace: Duration,
    pub hypervisor: Option<v2m::PluginKind>,
    pub migration: Option<MigrationConfig>,
    pub checkpoint: Option<launcher::launch::CheckpointPlan>,
}

/// The checks, in the order a user fixes them; `a.image` becomes the directory to boot
/// (built from a spec, or the private copy admission read under `images.signed_by`).
pub fn admission(
    a: &mut LaunchArgs,
    wanted: Option<Hypervisor>,
    resume: Option<&launcher::ckpt::Checkpoint>,
    job: &str,
) -> Result<Admitted> {
    let (rules, env): (LaunchRules, Option<EffectiveEnv>) = super::launch::rules(a)?;
    if a.guest_root {
        rules.check_guest_root("--guest-root")?;
    }
    let (shares, cwd) = super::launch::job_shares(a, env.as_ref(), resume.map(|c| &c.manifest))?;
    let sizes = super::launch::sizes(a, &rules, env.as_ref())?;
    let grace = super::launch::attach_grace(a, &rules)?;
    let (hypervisor, migration) = launcher::launch::hypervisor_and_migration(&rules, wanted)?;
    refuse_libvirt_in_batch_jobs(hypervisor, &a.allocation)?;
    // Before any build: a site's walltime checkpoint this launch cannot keep is refused here.
    let checkpoint = a.ckpt.plan(&rules.checkpoint, &a.allocation, job)?;
    let from = match &env {
        Some(env) => {
            super::site::refuse_spec_when_signed(&a.policies)?;
            a.image = super::build::image_for_spec(&a.image, &a.policies, env, a.json)?;
            super::site::ImageFrom::Spec
        }
        None => super::site::ImageFrom::Named,
    };
    // What is staged and booted is what admission read (a private copy under signed_by).
    a.image = super::site::admit(&a.image, &a.policies, from)?;
    Ok(Admitted {
        rules,
        shares,
        cwd,
        sizes,
        grace,
        hypervisor,
        migration,
        checkpoint,
    })
}

/// libvirtd, not the job, starts a libvirt VM's QEMU: it would run outside the batch job's
/// cgroups (unbounded by its memory, unaccounted, left behind by `scancel`).
fn refuse_libvirt_in_batch_jobs(
    hypervisor: Option<v2m::PluginKind>,
    allocation: &str,
) -> Result<()> {
    let batch = matches!(allocation, "slurm" | "pbs" | "torque");
    if batch && hypervisor == Some(v2m::PluginKind::Libvirt) {
        return Err(crate::exit::invalid(format!(
            "--hypervisor libvirt with --allocation {allocation}: libvirtd starts the VMs' QEMU outside the batch job's cgroups, so the job's memory limit, accounting and scancel would not reach them; hint: use --hypervisor qemu (or auto), whose QEMU runs inside the job"
        )));
    }
    Ok(())
}
