//! Disks that move with a live migration when the two ends share no storage, the way
//! libvirt's `--copy-storage-inc` does it: the destination runs on its own fresh overlays over
//! its own copy of the base image and exports them over NBD (TLS with the migration's key:
//! nothing listens unauthenticated); the source mirrors only its overlays' allocated clusters
//! there (`sync: top`, the bases are the same image), waits until the mirror is ready, and
//! then migrates the memory. The migration pauses before the switch-over (vCPUs stopped,
//! capability `pause-before-switchover`): the mirror is completed without pivoting then, so
//! the destination's disk is whole before the destination gets the last device state and
//! runs. On any failure the mirror is cancelled, its NBD client removed, and the source runs on.

use super::migration::{MigrationEnd, TLS_CREDS};
use super::vm::QemuVm;
use crate::error::{Result, V2mError};
use crate::plugin::{MigrationParams, MigrationTarget};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Export name and id on the destination, NBD client node and job id on the source: one
/// suffix per writable disk index.
const EXPORT: &str = "vse-disk";
const MIRROR: &str = "vse-mirror";

/// How often QEMU is asked for the progress of a job or of the migration.
const POLL: Duration = Duration::from_millis(20);

/// Ports tried when the NBD server's port is left to us: QEMU cannot report a port it chose.
const PORT_TRIES: usize = 20;

/// What the disk half of a migration did.
pub(super) struct Mirrored {
    pub disk_bytes: u64,
}

impl QemuVm {
    /// The writable disks and the block device QEMU gave each (`query-block`, matched by file).
    fn writable_disks(&mut self) -> Result<Vec<(usize, String, String)>> {
        let blocks = self.qmp("query-block", None)?;
        let blocks = blocks.as_array().cloned().unwrap_or_default();
        let mut out = Vec::new();
        for (i, d) in self.profile.disks.iter().enumerate() {
            if d.readonly {
                continue;
            }
            let file = d.path.to_string_lossy();
            let found = blocks.iter().find(|b| {
                b.pointer("/inserted/file").and_then(Value::as_str) == Some(file.as_ref())
            });
            let s = |b: &Value, p: &str| b.pointer(p).and_then(Value::as_str).map(str::to_owned);
            match found.and_then(|b| Some((s(b, "/device")?, s(b, "/inserted/node-name")?))) {
                Some((device, node)) => out.push((i, device, node)),
                None => {
                    return Err(
                        self.protocol(format!("query-block does not list disk {} ({file})", i))
                    );
                }
            }
        }
        Ok(out)
    }

    /// Destination: serves every writable disk over NBD at `host:port` (0: a free port),
    /// writable, TLS with the migration's credentials when `tls`. Returns the port.
    pub(super) fn export_disks(&mut self, host: &str, port: u16, tls: bool) -> Result<u16> {
        let loopback = host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
        if !tls && !loopback {
            return Err(V2mError::MigrationFailed {
                vm: self.profile.name.to_string(),
                message: format!(
                    "refusing to export the disks on {host} without the migration key (only loopback may go unauthenticated)"
                ),
            });
        }
        let port = self.start_nbd_server(host, port, tls)?;
        for (i, _, node) in self.writable_disks()? {
            let name = format!("{EXPORT}{i}");
            self.qmp(
                "block-export-add",
                Some(json!({
                    "type": "nbd", "id": name, "node-name": node, "name": name, "writable": true,
                })),
            )?;
        }
        Ok(port)
    }

    fn start_nbd_server(&mut self, host: &str, port: u16, tls: bool) -> Result<u16> {
        let tries = if port == 0 { PORT_TRIES } else { 1 };
        for _ in 0..tries {
            let p = if port == 0 {
                let l = std::net::TcpListener::bind((host, 0))
                    .map_err(|e| V2mError::io("finding a free port on", host, e))?;
                l.local_addr()
                    .map_err(|e| V2mError::io("finding a free port on", host, e))?
                    .port()
            } else {
                port
            };
            let mut args = json!({
                "addr": { "type": "inet", "data": { "host": host, "port": p.to_string() } },
            });
            if tls {
                args["tls-creds"] = json!(TLS_CREDS);
            }
            match self.qmp("nbd-server-start", Some(args)) {
                Ok(_) => return Ok(p),
                Err(V2mError::Qmp { desc, .. }) if desc.contains("in use") && port == 0 => {}
                Err(V2mError::Qmp { desc, .. }) if desc.contains("in use") => {
                    return Err(V2mError::PortInUse {
                        address: format!("{host}:{p}"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(V2mError::PortInUse {
            address: format!("{host}:0 ({PORT_TRIES} ports tried)"),
        })
    }

    /// Destination, once the state arrived (or never will): no export outlives the migration.
    pub(super) fn unexport_disks(&mut self) {
        for i in 0..self.profile.disks.len() {
            let id = format!("{EXPORT}{i}");
            let _ = self.qmp(
                "block-export-del",
                Some(json!({ "id": id, "mode": "hard" })),
            );
        }
        let _ = self.qmp("nbd-server-stop", None);
    }

    /// Source: mirrors the disks to the destination's exports, migrates the memory, and
    /// completes the mirror while paused before the switch-over. The caller armed TLS.
    pub(super) fn migrate_copying_disks(
        &mut self,
        target: &MigrationTarget,
        nbd_port: u16,
        params: &MigrationParams,
    ) -> Result<(Value, Mirrored)> {
        let started = Instant::now();
        let disks = self.writable_disks()?;
        let r = self.copy_then_migrate(target, nbd_port, params, &disks, started);
        if r.is_err() && self.proc_.is_some() {
            self.abandon_mirror(&disks);
        }
        let _ = self.set_pause_before_switchover(false);
        r
    }

    fn copy_then_migrate(
        &mut self,
        target: &MigrationTarget,
        nbd_port: u16,
        params: &MigrationParams,
        disks: &[(usize, String, String)],
        started: Instant,
    ) -> Result<(Value, Mirrored)> {
        let tls = target.key.is_some();
        for (i, device, _) in disks {
            let mut client = json!({
                "driver": "nbd",
                "node-name": format!("{MIRROR}{i}"),
                "server": { "type": "inet", "host": target.host, "port": nbd_port.to_string() },
                "export": format!("{EXPORT}{i}"),
            });
            if tls {
                client["tls-creds"] = json!(TLS_CREDS);
            }
            self.qmp("blockdev-add", Some(client))?;
            self.qmp(
                "blockdev-mirror",
                Some(json!({
                    "job-id": format!("{MIRROR}{i}"),
                    "device": device,
                    "target": format!("{MIRROR}{i}"),
                    "sync": "top",
                    "speed": params.max_bandwidth_bytes_per_s,
                    "auto-dismiss": false,
                })),
            )?;
        }
        for (i, _, _) in disks {
            self.wait_job(&format!("{MIRROR}{i}"), "ready", params.timeout, started)?;
        }
        self.set_pause_before_switchover(true)?;
        self.qmp("migrate", Some(json!({ "uri": target.uri() })))?;
        self.state = crate::state::VmState::Migrating;
        match self.wait_migration_until(params.timeout, started, true)? {
            None => {}
            Some(end) => return Err(self.ended_early(end)),
        }
        // vCPUs are stopped: completing the mirror now leaves nothing dirty behind it.
        let mut disk_bytes = 0;
        for (i, _, _) in disks {
            let job = format!("{MIRROR}{i}");
            // A mirror that failed while the memory moved (the destination's disk filled up,
            // its NBD server went away) says why here rather than refusing the cancel.
            self.wait_job(&job, "ready", params.timeout, started)?;
            self.qmp("block-job-cancel", Some(json!({ "device": job })))?;
            disk_bytes += self.wait_job(&job, "concluded", params.timeout, started)?;
            let _ = self.qmp("job-dismiss", Some(json!({ "id": job })));
            self.qmp("blockdev-del", Some(json!({ "node-name": job })))?;
        }
        self.qmp(
            "migrate-continue",
            Some(json!({ "state": "pre-switchover" })),
        )?;
        match self.wait_migration_until(params.timeout, started, false)? {
            Some(MigrationEnd::Completed(info)) => Ok((info, Mirrored { disk_bytes })),
            Some(end) => Err(self.ended_early(end)),
            None => Err(self.protocol("migration paused twice before the switch-over".into())),
        }
    }

    fn ended_early(&self, end: MigrationEnd) -> V2mError {
        let message = match end {
            MigrationEnd::Completed(_) => {
                "the migration completed before the disks were copied".into()
            }
            MigrationEnd::Failed(m) => m,
        };
        V2mError::MigrationFailed {
            vm: self.profile.name.to_string(),
            message,
        }
    }

    fn set_pause_before_switchover(&mut self, on: bool) -> Result<Value> {
        self.qmp(
            "migrate-set-capabilities",
            Some(json!({ "capabilities": [{ "capability": "pause-before-switchover", "state": on }] })),
        )
    }

    /// Polls the migration until it ends or (with `pause`) waits before the switch-over
    /// (`None`). Past the time limit the migration is cancelled.
    fn wait_migration_until(
        &mut self,
        timeout: Duration,
        started: Instant,
        pause: bool,
    ) -> Result<Option<MigrationEnd>> {
        loop {
            let info = self.qmp("query-migrate", None)?;
            match info.get("status").and_then(Value::as_str).unwrap_or("") {
                "completed" => return Ok(Some(MigrationEnd::Completed(info))),
                "failed" | "cancelled" => {
                    let desc = info.get("error-desc").and_then(Value::as_str);
                    let desc = desc.unwrap_or("no reason given").to_string();
                    return Ok(Some(MigrationEnd::Failed(desc)));
                }
                "pre-switchover" if pause => return Ok(None),
                _ => {}
            }
            if started.elapsed() >= timeout {
                return Err(V2mError::Timeout {
                    what: "migration to finish".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for block job `id` to reach `status`; returns the bytes it copied so far. A job
    /// that concluded with an error (e.g. the NBD connection dropped) fails the migration.
    fn wait_job(
        &mut self,
        id: &str,
        status: &str,
        timeout: Duration,
        started: Instant,
    ) -> Result<u64> {
        loop {
            let jobs = self.qmp("query-jobs", None)?;
            let job = jobs
                .as_array()
                .and_then(|a| a.iter().find(|j| j["id"] == id))
                .cloned();
            let Some(job) = job else {
                return Err(self.protocol(format!("block job {id} vanished")));
            };
            if let Some(e) = job.get("error").and_then(Value::as_str) {
                return Err(V2mError::MigrationFailed {
                    vm: self.profile.name.to_string(),
                    message: format!("copying the disk: {e}"),
                });
            }
            let now = job["status"].as_str().unwrap_or("");
            if now == status {
                return Ok(job["current-progress"].as_u64().unwrap_or(0));
            }
            if now == "concluded" || now == "aborting" || now == "null" {
                return Err(V2mError::MigrationFailed {
                    vm: self.profile.name.to_string(),
                    message: format!("copying the disk: the mirror job ended ({now})"),
                });
            }
            if started.elapsed() >= timeout {
                return Err(V2mError::Timeout {
                    what: format!("disk mirror {id} to become {status}"),
                    after: timeout,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// After a failure: the migration (if any) cancelled, so the source runs on its own disk;
    /// each mirror job force-cancelled and dismissed, each NBD client removed.
    fn abandon_mirror(&mut self, disks: &[(usize, String, String)]) {
        let _ = self.qmp("migrate_cancel", None);
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let info = self.qmp("query-migrate", None).unwrap_or_default();
            let s = info.get("status").and_then(Value::as_str).unwrap_or("none");
            if matches!(s, "none" | "completed" | "failed" | "cancelled") {
                break;
            }
            std::thread::sleep(POLL);
        }
        for (i, _, _) in disks {
            let job = format!("{MIRROR}{i}");
            let force = json!({ "device": job, "force": true });
            if self.qmp("block-job-cancel", Some(force)).is_ok() {
                while Instant::now() < until {
                    let jobs = self.qmp("query-jobs", None).unwrap_or_default();
                    let st = jobs
                        .as_array()
                        .and_then(|a| a.iter().find(|j| j["id"] == job.as_str()))
                        .and_then(|j| j["status"].as_str().map(str::to_owned));
                    if st.as_deref().is_none_or(|s| s == "concluded") {
                        break;
                    }
                    std::thread::sleep(POLL);
                }
            }
            let _ = self.qmp("job-dismiss", Some(json!({ "id": job })));
            let _ = self.qmp("blockdev-del", Some(json!({ "node-name": job })));
        }
    }
}
