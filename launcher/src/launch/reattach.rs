//! `vse attach`: a new front-end for a job whose `vse launch` died. The node agents kept the
//! VMs running (for the grace period the policies allow) and held what they had for the
//! front-end; this one reads the job's attach record, links to the agents, restarts the job's
//! switch where the VMs' relays send, resumes the controller from the state database
//! (finishing or rolling back a migration left half-done), and then runs the job on exactly
//! as the launch would have: rank output, statuses, monitoring, migration, teardown.

use super::attach::{AttachRecord, RecordFile, launch_alive};
use super::front::{Front, LaunchEvent, LaunchReport, outcome, report};
use super::relay::Owners;
use super::{LaunchError, wake::Requests};
use crate::net::{NetKey, Switch};
use crate::sync::lock;
use crate::wire::{BarrierMsg, Wire};
use agents::agent::{Event, ProcessSpawner, Remote};
use agents::proto::NodeId;
use control::migrate::{AckOutcome, ack_line};
use control::state::{LocateError, VmLocator};
use monitor::{NodeName, VmId};
use std::path::Path;
use std::sync::Arc;
use vse_exit::Exit;

type Job = agents::agent::Job<Wire>;

/// Takes over the job whose attach record is `record` and runs it to its end.
pub fn attach_blocking(
    record: &Path,
    audit: Option<vse_audit::Auditor>,
    on: impl FnMut(LaunchEvent) + Send,
) -> Result<LaunchReport, LaunchError> {
    super::front::runtime()?.block_on(attach(record, audit, on))
}

async fn attach(
    path: &Path,
    audit: Option<vse_audit::Auditor>,
    on: impl FnMut(LaunchEvent),
) -> Result<LaunchReport, LaunchError> {
    let mut file = RecordFile::load(path)?;
    // A second attach that gets here after this one waits on no lock: it finds this one's
    // pid in the record, or no agent left.
    let _held = hold(path)?;
    let rec = file.rec.clone();
    if rec.pid != std::process::id() && launch_alive(rec.pid) {
        return Err(LaunchError::Attach(format!(
            "job {}: its front-end (pid {}) is still running; hint: `vse attach` takes over a job whose `vse launch` died",
            rec.job, rec.pid
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| LaunchError::Attach(format!("cannot find the vse executable: {e}")))?;
    let spawner = Arc::new(ProcessSpawner {
        exe,
        remote: Remote::Direct,
    });
    let cfg = rec.agent_config(spawner)?;
    let key = NetKey::derive(&cfg.secret);
    let plan = rec.plan();
    let mut ranks = rec.ranks.clone();
    let owners: Owners = Arc::new(std::sync::Mutex::new(
        ranks.iter().map(|r| (r.vm.clone(), r.node)).collect(),
    ));
    let monitor = rec.monitor();
    let job = Job::attach(cfg, rec.directory.clone());
    let mut f = Front::new(job, on, plan.names.clone(), owners.clone());
    f.audit = audit.map(|a| super::audit::JobAudit::new(a, &rec.job));
    f.mark("agents");
    (f.on)(LaunchEvent::Phase(format!(
        "attaching to {} agent(s) of job {}",
        rec.directory.len(),
        rec.job
    )));
    let kept = match f.ready_keeping().await {
        Ok(k) => k,
        Err(e) => {
            let _ = f.finish(report(Exit::NodeFailed.code(), e.clone())).await;
            file.remove();
            return Err(LaunchError::Attach(format!(
                "job {}: {e}; hint: its agents end {} s after losing their front-end",
                rec.job,
                rec.orphan_grace_ms / 1000
            )));
        }
    };
    // This process is the job's front-end now.
    file.update(|r| r.pid = std::process::id());
    f.record = Some(file);
    if let (Some(m), Some(layout)) = (&monitor, &plan.layout) {
        let mut locator = Locator {
            owners,
            names: plan.names.clone(),
        };
        if let Err(e) = f.control(m, layout, plan.mpi, Some(&mut locator)) {
            return Ok(f
                .finish(report(Exit::NodeFailed.code(), e.to_string()))
                .await);
        }
    }
    if let Some(hub) = f.hub.as_mut() {
        for (vm, conns) in &rec.barrier {
            hub.adopt(vm, conns);
        }
        release_held(&f, &rec);
    }
    let switch = match &rec.net {
        Some(net) => match Switch::start_at(net.switch, key) {
            // The nodes tell it their VMs' relays again.
            Ok(sw) => Some(sw),
            Err(e) => {
                let r = format!("job network: cannot restart the switch: {e}");
                return Ok(f.finish(report(Exit::VmFailed.code(), r)).await);
            }
        },
        None => None,
    };
    f.mark("attached");
    (f.on)(LaunchEvent::Phase("attached".into()));
    let net = (switch.as_ref(), rec.net.as_ref());
    for (from, msg) in kept {
        f.on_message(&plan, &mut ranks, net.0, net.1, from, msg);
    }
    let mut ck = match rec.checkpoint.as_ref().map(|c| c.resume()).transpose() {
        Ok(ck) => ck,
        Err(e) => {
            let r = format!("checkpoint directory: {e}");
            return Ok(f.finish(report(Exit::InvalidInput.code(), r)).await);
        }
    };
    let mut asked = (monitor.as_ref()).and_then(|m| Requests::open(&m.control.db, &rec.job));
    let mut taken = Vec::new();
    let ended = f
        .collect(
            &plan,
            &mut ranks,
            net,
            ck.as_mut(),
            &mut taken,
            asked.as_mut(),
        )
        .await;
    if let (None, Some(ck)) = (&ended, &ck)
        && !ranks.iter().any(|r| r.error.is_some())
    {
        // As at the end of a launch: a finished job is not resumed.
        let _ = ck.dir.retire();
    }
    f.mark("teardown");
    let (code, reason) = outcome(&ranks, ended, plan.mpi);
    let mut rep = report(code, reason);
    rep.ranks = ranks;
    rep.checkpoints = taken;
    let mut rep = f.finish(rep).await;
    rep.network = switch.map(|s| s.stats());
    Ok(rep)
}

/// One `vse attach` per job at a time: an exclusive lock on a file next to the record.
fn hold(record: &Path) -> Result<std::fs::File, LaunchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = super::attach::lock_path(record);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| LaunchError::Attach(format!("{}: {e}", p.display())))?;
    if f.try_lock().is_err() {
        return Err(LaunchError::Attach(format!(
            "another `vse attach` holds this job ({})",
            p.display()
        )));
    }
    Ok(f)
}

impl<F: FnMut(LaunchEvent)> Front<F> {
    /// Waits until every agent routes to this front-end again, keeping what they send
    /// meanwhile (what they held while the job had no front-end) in order.
    async fn ready_keeping(&mut self) -> Result<Vec<(NodeId, Wire)>, String> {
        let mut kept = Vec::new();
        loop {
            match self.next(None).await {
                Ok(Some(Event::Ready { .. })) => return Ok(kept),
                Ok(Some(Event::Message { from, msg })) => kept.push((from, msg)),
                Ok(_) => {}
                Err(super::front::Ended::FrontEnd) => {
                    return Err("no agent of the job answered".into());
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// Where the job's VMs run, as the record last knew it (the recovery asks nothing else: a
/// migration whose end was not recorded is rolled back or finished by where its VM is).
struct Locator {
    owners: Owners,
    names: Vec<NodeName>,
}

impl VmLocator for Locator {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, LocateError> {
        let node = lock(&self.owners).get(vm.as_str()).copied();
        Ok(node.and_then(|n| self.names.get(n.0 as usize - 1).cloned()))
    }
}

/// Ranks the old front-end held at a barrier wait for an answer its server can no longer
/// give: the notice of a migration the recovery finished or rolled back, or of the
/// checkpoint it was taking. Each gets that answer (a rank holding another notice, or none,
/// ignores it).
fn release_held<F: FnMut(LaunchEvent)>(f: &Front<F>, rec: &AttachRecord) {
    let mut answers: Vec<(i64, AckOutcome)> = (f.control.as_ref())
        .map(|c| c.recovered().to_vec())
        .unwrap_or_default();
    if let Some(c) = rec.checkpoint.as_ref().filter(|c| c.next_id > 1) {
        answers.push((
            super::checkpoint::notice(c.next_id - 1),
            AckOutcome::Cancelled,
        ));
    }
    for (vm, conns) in &rec.barrier {
        let Some(owner) = lock(&f.owners).get(vm).copied() else {
            continue;
        };
        for (c, (id, outcome)) in conns
            .iter()
            .flat_map(|c| answers.iter().map(move |a| (c, a)))
        {
            let line = ack_line(*id, *outcome);
            let down = BarrierMsg::Down {
                vm: vm.clone(),
                conn: c.conn,
                line,
            };
            f.send(owner, Wire::Barrier(down));
        }
    }
}
