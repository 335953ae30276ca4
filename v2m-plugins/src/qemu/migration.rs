//! Moving a QEMU VM's state: live migration out (source), the incoming side (destination
//! and restore), and checkpoints to a file, all through QEMU's migration stream.

use super::statefile::StateWriter;
use super::vm::QemuVm;
use crate::error::{Result, V2mError};
use crate::plugin::{
    CheckpointReport, DiskMigration, MigrationKey, MigrationParams, MigrationReport,
    MigrationTarget,
};
use crate::state::{Operation, VmState};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// How a migration stream QEMU ran ended: its final `query-migrate` answer, or QEMU's reason.
pub(super) enum MigrationEnd {
    Completed(Value),
    Failed(String),
}

/// Bandwidth for checkpoints: local files should not be throttled to QEMU's 128 MiB/s default.
const CHECKPOINT_BANDWIDTH: u64 = 10 << 30;
/// The name QEMU knows the checkpoint's pipe by (`getfd`, then `fd:` migration).
const STATE_FD: &str = "vse-checkpoint";
/// The name of the checkpoint file's descriptor a restore reads.
const RESTORE_FD: &str = "vse-restore";

/// QOM id of the migration's TLS credentials, and the PSK identity both ends use.
pub(super) const TLS_CREDS: &str = "vse-migration-tls";
const PSK_IDENTITY: &str = "vse";

/// Why TLS with a pre-shared key, rather than relaying the stream through the node agents'
/// authenticated connection: QEMU then authenticates the stream itself, at the one socket an
/// outsider could reach, so nothing else has to listen (no relay port, no extra copy of every
/// byte through the agent), and a connection that fails the handshake is dropped while the
/// listener stays open for the real source (a raw listener takes its first connection as the
/// migration and a stranger's garbage kills the destination). The key file lives in the VM's
/// run directory, in a subdirectory only this user can read.
impl QemuVm {
    /// Arms (with a key) or disarms the TLS layer of this VM's next migration stream:
    /// `endpoint` is "server" on the destination, "client" on the source.
    fn migration_tls(&mut self, key: Option<&MigrationKey>, endpoint: &str) -> Result<()> {
        let Some(key) = key else {
            self.qmp("migrate-set-parameters", Some(json!({ "tls-creds": "" })))?;
            return Ok(());
        };
        let dir = self.paths.dir.join("tls");
        write_psk(&dir, key)?;
        // A retried migration of the same VM replaces the previous credentials.
        let _ = self.qmp("object-del", Some(json!({ "id": TLS_CREDS })));
        let mut creds = json!({
            "qom-type": "tls-creds-psk",
            "id": TLS_CREDS,
            "endpoint": endpoint,
            "dir": dir.to_string_lossy(),
        });
        if endpoint == "client" {
            creds["username"] = json!(PSK_IDENTITY);
        }
        self.qmp("object-add", Some(creds))?;
        self.qmp(
            "migrate-set-parameters",
            Some(json!({ "tls-creds": TLS_CREDS })),
        )?;
        Ok(())
    }
}

/// `dir/keys.psk` as QEMU (GnuTLS) reads it, `identity:hex-key`, readable by this user only.
fn write_psk(dir: &Path, key: &MigrationKey) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let io = |what, e| V2mError::io(what, dir, e);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("creating the TLS key directory", e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("restricting the TLS key directory", e))?;
    let file = dir.join("keys.psk");
    let _ = std::fs::remove_file(&file);
    let hexkey: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .map_err(|e| V2mError::io("writing the TLS key", &file, e))?;
    f.write_all(format!("{PSK_IDENTITY}:{hexkey}\n").as_bytes())
        .map_err(|e| V2mError::io("writing the TLS key", &file, e))?;
    let dh = dir.join("dh-params.pem");
    std::fs::write(&dh, FFDHE2048).map_err(|e| V2mError::io("writing the DH parameters", &dh, e))
}

/// The RFC 7919 ffdhe2048 group. Without `dh-params.pem` next to the key, a server-side QEMU
/// generates 2048-bit DH parameters when the credentials are created: seconds to minutes of
/// its main loop (QMP unanswered) on a loaded node, for a group nothing requires to be fresh.
const FFDHE2048: &str = "-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
";

impl QemuVm {
    pub(super) fn migrate_out(
        &mut self,
        target: &MigrationTarget,
        params: &MigrationParams,
    ) -> Result<MigrationReport> {
        let prev = self.state;
        self.check(Operation::Migrate)?;
        let started = Instant::now();
        self.qmp(
            "migrate-set-parameters",
            Some(json!({
                "max-bandwidth": params.max_bandwidth_bytes_per_s,
                "downtime-limit": params.downtime_limit_ms,
            })),
        )?;
        self.migration_tls(target.key.as_ref(), "client")?;
        let r = match target.disks {
            DiskMigration::Shared => self.migrate_shared(target, params),
            DiskMigration::Copy { port } => self
                .migrate_copying_disks(target, port, params)
                .map(|(info, m)| (info, m.disk_bytes)),
        };
        let (info, disk_bytes) = match r {
            Ok(done) => done,
            Err(e) => {
                if self.proc_.is_some() {
                    // Checkpoints use the same stream: they must not inherit this one's TLS.
                    let _ = self.migration_tls(None, "client");
                    self.state = prev;
                }
                return Err(e);
            }
        };
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        let total_time_ms = match target.disks {
            // QEMU's clock starts with the memory; the disk copy came first.
            DiskMigration::Copy { .. } => started.elapsed().as_millis() as u64,
            DiskMigration::Shared => num(&info, "total-time"),
        };
        let report = MigrationReport {
            total_time_ms,
            downtime_ms: num(&info, "downtime"),
            setup_time_ms: num(&info, "setup-time"),
            transferred_bytes: info.get("ram").map(|r| num(r, "transferred")).unwrap_or(0),
            disk_bytes,
            storage: target.disks.mode(),
            max_bandwidth_bytes_per_s: params.max_bandwidth_bytes_per_s,
            downtime_limit_ms: params.downtime_limit_ms,
        };
        // Confirm: the destination has the VM now; the source must not run twice.
        self.quit_process();
        Ok(report)
    }

    /// The memory over the stream; the destination opens the same disk files.
    fn migrate_shared(
        &mut self,
        target: &MigrationTarget,
        params: &MigrationParams,
    ) -> Result<(Value, u64)> {
        self.qmp("migrate", Some(json!({ "uri": target.uri() })))?;
        self.state = VmState::Migrating;
        match self.wait_migration(params.timeout)? {
            MigrationEnd::Completed(info) => Ok((info, 0)),
            MigrationEnd::Failed(message) => Err(V2mError::MigrationFailed {
                vm: self.profile.name.to_string(),
                message,
            }),
        }
    }

    /// The VM's state into `path`, atomically (a partial file never takes its name), with
    /// its SHA-256 computed on the way in.
    pub(super) fn save_to(&mut self, path: &Path) -> Result<CheckpointReport> {
        self.check(Operation::Checkpoint)?;
        let started = Instant::now();
        if self.state == VmState::Running {
            self.qmp("stop", None)?;
            self.state = VmState::Paused;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".partial-{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let io = |what, e| V2mError::io(what, &tmp, e);
        let file = std::fs::File::create(&tmp).map_err(|e| io("creating checkpoint", e))?;
        let writer = StateWriter::start(file).map_err(|e| io("a pipe for checkpoint", e))?;
        let run = self.migrate_into(writer.write_end);
        let fail = |vm: &Self, message: String| {
            let _ = std::fs::remove_file(&tmp);
            V2mError::CheckpointFailed {
                vm: vm.profile.name.to_string(),
                message,
            }
        };
        match run {
            Ok(MigrationEnd::Completed(_)) => {}
            Ok(MigrationEnd::Failed(m)) => return Err(fail(self, m)),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        // QEMU closes its end once the migration completed: the writer has all of it. (On a
        // failure the writer is left to end when QEMU closes the pipe or goes.)
        let (bytes, sha256) = match writer.done.join() {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => return Err(fail(self, format!("writing {}: {e}", tmp.display()))),
            Err(_) => return Err(fail(self, "the state writer panicked".into())),
        };
        std::fs::rename(&tmp, path).map_err(|e| V2mError::io("renaming checkpoint to", path, e))?;
        Ok(CheckpointReport {
            path: path.to_path_buf(),
            bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            sha256: Some(sha256),
        })
    }

    /// Migrates the paused VM into `fd` (handed to QEMU, closed here either way).
    fn migrate_into(&mut self, fd: std::os::fd::OwnedFd) -> Result<MigrationEnd> {
        use std::os::fd::AsRawFd;
        self.qmp(
            "migrate-set-parameters",
            Some(json!({ "max-bandwidth": CHECKPOINT_BANDWIDTH, "tls-creds": "" })),
        )?;
        let Some(q) = self.qmp.as_mut() else {
            return Err(self.protocol("no QMP connection for getfd".into()));
        };
        let args = json!({ "fdname": STATE_FD });
        let passed = q.execute_with_fd("getfd", Some(args), fd.as_raw_fd());
        passed.map_err(|e| self.qmp_err("getfd", e))?;
        // QEMU holds its own copy now; ours must go, or the writer never sees the end.
        drop(fd);
        let uri = format!("fd:{STATE_FD}");
        if let Err(e) = self.qmp("migrate", Some(json!({ "uri": uri }))) {
            // A descriptor QEMU never took for a migration would keep the pipe open.
            let _ = self.qmp("closefd", Some(json!({ "fdname": STATE_FD })));
            return Err(e);
        }
        self.wait_migration(Duration::from_secs(600))
    }

    /// Err only when QEMU could not be asked; a migration QEMU gave up on is an `Ended`.
    pub(super) fn wait_migration(&mut self, timeout: Duration) -> Result<MigrationEnd> {
        let start = Instant::now();
        loop {
            let info = self.qmp("query-migrate", None)?;
            match info.get("status").and_then(Value::as_str).unwrap_or("") {
                "completed" => return Ok(MigrationEnd::Completed(info)),
                "failed" | "cancelled" => {
                    let desc = info
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given");
                    return Ok(MigrationEnd::Failed(desc.to_string()));
                }
                _ => {}
            }
            if start.elapsed() >= timeout {
                let _ = self.qmp("migrate_cancel", None);
                return Err(V2mError::Timeout {
                    what: "migration to finish".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Quits QEMU after its state went elsewhere (migration source).
    pub(super) fn quit_process(&mut self) {
        let _ = self.qmp("quit", None);
        if let Some(p) = self.proc_.as_mut()
            && !p.wait_exit(Duration::from_secs(5))
        {
            p.kill();
        }
        self.qmp = None;
        self.proc_ = None;
        self.state = VmState::Stopped;
        self.clean_files();
    }

    /// Incoming side (migration destination and restore): start listening; with a key, only
    /// a source that completes the TLS handshake with it is taken.
    pub(super) fn listen(
        &mut self,
        uri: &str,
        address: &str,
        key: Option<&MigrationKey>,
    ) -> Result<()> {
        if key.is_some()
            && let Err(e) = self.migration_tls(key, "server")
        {
            self.kill_and_clean();
            return Err(e);
        }
        if let Err(e) = self.qmp("migrate-incoming", Some(json!({ "uri": uri }))) {
            self.kill_and_clean();
            return Err(match e {
                V2mError::Qmp { desc, .. } if desc.contains("Address already in use") => {
                    V2mError::PortInUse {
                        address: address.to_string(),
                    }
                }
                other => other,
            });
        }
        self.state = VmState::Migrating;
        Ok(())
    }

    /// Incoming side of a restore: QEMU reads the state from `fd` (passed with `getfd`).
    pub(super) fn listen_fd(&mut self, fd: std::os::fd::OwnedFd, what: &str) -> Result<()> {
        use std::os::fd::AsRawFd;
        let Some(q) = self.qmp.as_mut() else {
            return Err(self.protocol("no QMP connection for getfd".into()));
        };
        let args = json!({ "fdname": RESTORE_FD });
        if let Err(e) = q.execute_with_fd("getfd", Some(args), fd.as_raw_fd()) {
            let e = self.qmp_err("getfd", e);
            self.kill_and_clean();
            return Err(e);
        }
        drop(fd);
        self.listen(&format!("fd:{RESTORE_FD}"), what, None)
    }

    /// The port an incoming migration actually bound (port 0 means "any").
    pub(super) fn bound_port(&mut self) -> Result<u16> {
        let info = self.qmp("query-migrate", None)?;
        let port = info
            .get("socket-address")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|s| s.get("port"))
            .and_then(|p| {
                p.as_str()
                    .map(str::to_owned)
                    .or_else(|| p.as_u64().map(|n| n.to_string()))
            })
            .and_then(|p| p.parse().ok());
        port.ok_or_else(|| {
            self.protocol(format!(
                "query-migrate did not report the listening port: {info}"
            ))
        })
    }

    pub(super) fn set_incoming(&mut self, t: MigrationTarget) -> Result<()> {
        self.incoming = Some(t);
        self.write_meta()
    }

    /// Waits until incoming state has loaded; the VM then runs (or stays paused if it was).
    pub(super) fn wait_incoming(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.refresh()?;
            let r = self.qmp("query-status", None)?;
            match r.get("status").and_then(Value::as_str).unwrap_or("") {
                "inmigrate" | "prelaunch" => {}
                "running" => {
                    self.state = VmState::Running;
                    break;
                }
                "paused" | "postmigrate" | "finish-migrate" | "restore-vm" => {
                    self.state = VmState::Paused;
                    break;
                }
                other => {
                    let other = other.to_string();
                    self.kill_and_clean();
                    return Err(V2mError::MigrationFailed {
                        vm: self.profile.name.to_string(),
                        message: format!("incoming VM ended in state {other}"),
                    });
                }
            }
            if start.elapsed() >= timeout {
                return Err(V2mError::Timeout {
                    what: "incoming migration state".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if matches!(
            self.incoming.as_ref().map(|t| t.disks),
            Some(DiskMigration::Copy { .. })
        ) {
            self.unexport_disks();
        }
        self.incoming = None;
        self.write_meta()
    }
}
