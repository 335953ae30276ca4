//! A launch that resumes a checkpoint: the same image, the same ranks with the same sizes,
//! each VM restored from its saved state and disk (ranks that had ended keep their status),
//! and a launch's own checkpointing set up from its plan.

use super::checkpoint::{Checkpointing, base_manifest};
use super::front::{LaunchRequest, RankResult};
use super::relay::BarrierHub;
use super::run::JobPlan;
use crate::ckpt::{Checkpoint, CheckpointDir, Cut, Manifest, Schedule};
use crate::wire::{RestoreVm, VmOrder};
use control::migrate::{AckOutcome, ack_line};

/// Whether this launch can restore `ck`: the image staged is the one checkpointed, and the
/// plan has the same ranks, VM names and vCPUs (a saved VM loads only into the same devices).
pub(super) fn matches(ck: &Checkpoint, digest: &str, plan: &JobPlan) -> Result<(), String> {
    let m = &ck.manifest;
    let at = ck.dir.display();
    if m.image_digest != digest {
        return Err(format!(
            "{at}: the checkpoint was taken of image {}, this launch staged {digest}; hint: launch the image (or spec) the job ran",
            m.image_digest
        ));
    }
    if m.ranks.len() as u32 != plan.size() {
        return Err(format!(
            "{at}: the checkpoint holds {} rank(s), this launch plans {}; hint: give the same --vms-per-node and --spare-nodes on as many nodes",
            m.ranks.len(),
            plan.size()
        ));
    }
    for (r, s) in m.ranks.iter().zip(&plan.slots) {
        let (name, vcpus) = (&plan.vm_names[r.rank as usize], s.order.cpus.len() as u32);
        if &r.vm != name || r.vcpus != vcpus {
            return Err(format!(
                "{at}: rank {} was VM {} with {} vCPU(s), this launch plans {name} with {vcpus}; hint: keep the job's name and --vcpus",
                r.rank, r.vm, r.vcpus
            ));
        }
    }
    Ok(())
}

/// The order of one VM: restored from `ck` when it was saved; `None` for a rank that had
/// ended (no VM).
pub(super) fn order(ck: &Checkpoint, mut o: VmOrder) -> Option<VmOrder> {
    let r = ck.manifest.ranks.get(o.rank as usize)?;
    let s = r.saved.as_ref()?;
    o.restore = Some(RestoreVm {
        state: ck.dir.join(&s.state.file),
        disk: ck.dir.join(&s.disk.file),
        disk_sha256: s.disk.sha256.clone(),
        exec_id: s.exec_id,
        first_id: s.first_id,
        barrier_lines: match ck.manifest.cut {
            Cut::Barrier { notice } => (s.barrier.iter())
                .map(|c| (c.conn, ack_line(notice, AckOutcome::Checkpointed)))
                .collect(),
            Cut::Pause => Vec::new(),
        },
    });
    Some(o)
}

/// The saved VMs' barrier connections, introduced to this launch's barrier server: later
/// migrations and checkpoints hold the restored ranks as they held the first launch's.
pub(super) fn barrier_conns(m: &Manifest, hub: &mut BarrierHub) {
    for s in m.ranks.iter().filter_map(|r| r.saved.as_ref()) {
        hub.adopt(&s.vm, &s.barrier);
    }
}

/// Ranks that had ended before the checkpoint end with the status they had.
pub(super) fn ended_ranks(m: &Manifest, ranks: &mut [RankResult]) {
    for r in &m.ranks {
        if let (Some(code), Some(rank)) = (r.status, ranks.get_mut(r.rank as usize)) {
            rank.status = Some(code);
        }
    }
}

/// The launch's checkpointing, when it asked for a checkpoint directory.
pub(super) fn checkpointing(
    req: &LaunchRequest,
    plan: &JobPlan,
    digest: &str,
) -> Result<Option<Checkpointing>, String> {
    let Some(p) = &req.checkpoint else {
        return Ok(None);
    };
    let dir = CheckpointDir::create(&p.dir).map_err(|e| e.to_string())?;
    let memory = u64::from(plan.size()) * (req.memory_mib << 20);
    Ok(Some(Checkpointing {
        dir,
        schedule: Schedule::new(p.end, p.at_walltime_end, p.every, memory),
        keep: p.keep,
        on_term: p.on_term,
        next_id: 1,
        base: base_manifest(&req.job_name, digest, req, plan),
    }))
}
