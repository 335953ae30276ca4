//! The baseline without vse: the same guest on a plain QEMU command line, migrated by hand over
//! QMP between two "node" directories, (a) with the destination opening the source's overlay
//! (shared storage) and (b) the way libvirt's `--copy-storage-inc` does it without shared
//! storage: the destination starts paused (`-S -incoming defer`) on a fresh qcow2 overlay of
//! its own copy of the base and exports it (`nbd-server-start` + `nbd-server-add`); the
//! source `drive-mirror`s its overlay's allocated clusters there (`sync: top`), waits for the
//! job to be ready, migrates the memory, and once the migration completed (source paused)
//! cancels the ready job (which leaves the copy consistent), after which the destination
//! stops its NBD server and continues. Neither the stream nor the export use TLS (libvirt's
//! default); vse's do.

use super::images::{overlay, write_data};
use super::qmp::Qmp;
use crate::BenchError;
use serde::Serialize;
use serde_json::{Value, json};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use v2m::{ImageRef, MigrationParams};
use vse_guest_agent::{Barriers, GuestLink, LinkOptions};

const DRIVE: &str = "virtio0";
const JOB: &str = "bench-mirror";
const POLL: Duration = Duration::from_millis(20);

/// One by-hand migration.
#[derive(Debug, Clone, Serialize)]
pub struct RawRecord {
    /// "shared" or "block-copy".
    pub storage: &'static str,
    /// Destination started → destination running (wall).
    pub total_ms: u64,
    /// The source's part: mirror (block copy) and memory until QEMU reports completion.
    pub send_ms: u64,
    /// QEMU's own figure (`query-migrate` total-time: the memory stream only).
    pub qemu_total_ms: u64,
    /// QEMU's `downtime`. With block copy the guest stays paused after it for `resume_ms`.
    pub downtime_ms: u64,
    /// Migration completed → destination running: the mirror's cancel and `cont`.
    pub resume_ms: u64,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
}

/// A plain QEMU process, killed on drop.
struct RawVm {
    child: Child,
    qmp: Qmp,
    disk: PathBuf,
}

impl Drop for RawVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two node directories, each with its own copy of the base disk.
pub(super) struct RawNodes<'a> {
    pub guest: &'a ImageRef,
    pub accel: &'static str,
    pub memory: u64,
    /// (directory, base raw disk) per node.
    pub nodes: [(PathBuf, PathBuf); 2],
    pub params: &'a MigrationParams,
    seq: u32,
}

impl<'a> RawNodes<'a> {
    pub(super) fn new(
        guest: &'a ImageRef,
        accel: &'static str,
        memory: u64,
        nodes: [(PathBuf, PathBuf); 2],
        params: &'a MigrationParams,
    ) -> Self {
        RawNodes {
            guest,
            accel,
            memory,
            nodes,
            params,
            seq: 0,
        }
    }

    /// The plain command line: vse's VM's devices (the guest agent's port too, used only to
    /// write the disk data), console to a file, QMP on `dir/qmp.sock`.
    fn argv(&self, dir: &Path, disk: &Path) -> Vec<String> {
        let fixed = "-name guest=bench-raw -machine pc -nodefaults -no-user-config -display none \
                     -no-reboot -smp 1 -device virtio-serial-pci,id=vser0";
        let mut a: Vec<String> = fixed.split_whitespace().map(String::from).collect();
        let g = self.guest;
        let mut add = |k: &str, v: String| a.extend([k.to_string(), v]);
        add("-accel", self.accel.to_string());
        add("-m", format!("{}M", self.memory));
        add("-kernel", g.kernel.to_string_lossy().into_owned());
        if let Some(i) = &g.initrd {
            add("-initrd", i.to_string_lossy().into_owned());
        }
        add("-append", g.cmdline.clone());
        add(
            "-serial",
            format!("file:{}", dir.join("console.log").display()),
        );
        let qmp = dir.join("qmp.sock");
        add("-qmp", format!("unix:{},server=on,wait=off", qmp.display()));
        let agent = dir.join("a.sock");
        add(
            "-chardev",
            format!(
                "socket,id=agent,path={},server=on,wait=off",
                agent.display()
            ),
        );
        let port = v2m::AGENT_PORT_NAME;
        add(
            "-device",
            format!("virtserialport,bus=vser0.0,chardev=agent,name={port}"),
        );
        add(
            "-drive",
            format!("file={},format=qcow2,if=virtio,index=0", disk.display()),
        );
        a
    }

    /// QEMU on `node` over `disk`; `incoming`: waiting for a migration (`hold`: and paused
    /// after it, until `cont`).
    fn spawn(
        &mut self,
        node: usize,
        disk: &Path,
        incoming: bool,
        hold: bool,
    ) -> Result<RawVm, BenchError> {
        self.seq += 1;
        let dir = self.nodes[node].0.join(format!("vm{}", self.seq));
        std::fs::create_dir_all(&dir).map_err(BenchError::io("creating a raw VM directory"))?;
        let sock = dir.join("qmp.sock");
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(self.argv(&dir, disk));
        if incoming {
            cmd.args(["-incoming", "defer"]);
        }
        if hold {
            cmd.arg("-S");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        cmd.stderr(std::fs::File::create(dir.join("qemu.stderr"))?);
        // SAFETY: prctl is async-signal-safe; QEMU dies with this process, never outlives it.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(BenchError::io("starting qemu-system-x86_64"))?;
        let qmp = Qmp::connect(&sock, Duration::from_secs(60));
        let vm = RawVm {
            child,
            qmp: qmp.map_err(|e| BenchError::Failed(format!("raw QEMU on node {node}: {e}")))?,
            disk: disk.to_path_buf(),
        };
        Ok(vm)
    }

    /// Boots the guest on node 0 over a fresh overlay; once its agent answers, the guest
    /// writes `data_mib` MiB to its disk as vse's does, and the agent's socket is let go.
    fn boot(&mut self, data_mib: u64) -> Result<RawVm, BenchError> {
        let disk = overlay(&self.nodes[0].1, &self.nodes[0].0.join("disk0.qcow2"))?;
        let vm = self.spawn(0, &disk, false, false)?;
        let sock = self.nodes[0]
            .0
            .join(format!("vm{}", self.seq))
            .join("a.sock");
        let opts = LinkOptions::new(Duration::from_secs(300)).barriers(Barriers::None);
        let link = GuestLink::connect(&sock, &opts)
            .map_err(|e| BenchError::Failed(format!("the plain QEMU guest's agent: {e}")))?;
        write_data(&link, data_mib)?;
        Ok(vm)
    }
}

fn qmp(vm: &mut RawVm, command: &str, args: Value) -> Result<Value, BenchError> {
    Ok(vm.qmp.run(command, args)?)
}

fn free_port() -> Result<u16, BenchError> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(BenchError::io("finding a free loopback port"))?;
    Ok(l.local_addr()?.port())
}

/// `rounds` migrations each way (shared, then block copy) of one plain QEMU guest.
pub(super) fn run(
    nodes: &mut RawNodes<'_>,
    rounds: u32,
    data_mib: u64,
    step: crate::Step,
) -> Result<(Vec<RawRecord>, Vec<RawRecord>), BenchError> {
    step("booting the guest on a plain QEMU command line");
    let mut vm = nodes.boot(data_mib)?;
    let (mut at, mut shared, mut copy) = (0usize, Vec::new(), Vec::new());
    for r in 0..rounds {
        step(&format!(
            "raw QEMU migration, shared disk {}/{rounds}",
            r + 1
        ));
        let (moved, rec) = migrate(nodes, &mut vm, 1 - at, false)?;
        (vm, at) = (moved, 1 - at);
        shared.push(rec);
    }
    for r in 0..rounds {
        step(&format!(
            "raw QEMU migration with drive-mirror {}/{rounds}",
            r + 1
        ));
        let (moved, rec) = migrate(nodes, &mut vm, 1 - at, true)?;
        let old = std::mem::replace(&mut vm, moved);
        let old_disk = old.disk.clone();
        drop(old);
        let _ = std::fs::remove_file(old_disk);
        at = 1 - at;
        copy.push(rec);
    }
    Ok((shared, copy))
}

/// Moves `src` to node `to`; returns the destination VM (running) and the record. The source
/// is left paused after its migration (the caller drops it).
fn migrate(
    nodes: &mut RawNodes<'_>,
    src: &mut RawVm,
    to: usize,
    copy: bool,
) -> Result<(RawVm, RawRecord), BenchError> {
    let t0 = Instant::now();
    let disk = if copy {
        let n = nodes.seq + 1;
        overlay(
            &nodes.nodes[to].1,
            &nodes.nodes[to].0.join(format!("disk{n}.qcow2")),
        )?
    } else {
        src.disk.clone()
    };
    let mut dst = nodes.spawn(to, &disk, true, copy)?;
    let sending = Instant::now();
    let disk_bytes = if copy {
        start_mirror(src, &mut dst, nodes.params)?
    } else {
        0
    };
    let port = free_port()?;
    let uri = format!("tcp:127.0.0.1:{port}");
    qmp(&mut dst, "migrate-incoming", json!({ "uri": uri }))?;
    let p = nodes.params;
    let limits = json!({ "max-bandwidth": p.max_bandwidth_bytes_per_s, "downtime-limit": p.downtime_limit_ms });
    qmp(src, "migrate-set-parameters", limits)?;
    qmp(src, "migrate", json!({ "uri": uri }))?;
    let info = wait_migration(src, p.timeout)?;
    let (send_ms, completed) = (sending.elapsed().as_millis() as u64, Instant::now());
    if copy {
        finish_mirror(src, p.timeout)?;
        qmp(&mut dst, "nbd-server-stop", json!({}))?;
        qmp(&mut dst, "cont", json!({}))?;
    }
    wait_running(&mut dst, p.timeout)?;
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let rec = RawRecord {
        storage: if copy { "block-copy" } else { "shared" },
        total_ms: t0.elapsed().as_millis() as u64,
        send_ms,
        qemu_total_ms: num(&info, "total-time"),
        downtime_ms: num(&info, "downtime"),
        resume_ms: completed.elapsed().as_millis() as u64,
        disk_bytes,
        memory_bytes: info.get("ram").map_or(0, |r| num(r, "transferred")),
    };
    Ok((dst, rec))
}

/// Destination exports its overlay; the source mirrors into it until the job is ready.
/// Returns the bytes the job copied by then.
fn start_mirror(src: &mut RawVm, dst: &mut RawVm, p: &MigrationParams) -> Result<u64, BenchError> {
    let port = free_port()?;
    let addr = json!({ "type": "inet", "data": { "host": "127.0.0.1", "port": port.to_string() } });
    qmp(dst, "nbd-server-start", json!({ "addr": addr }))?;
    qmp(
        dst,
        "nbd-server-add",
        json!({ "device": DRIVE, "writable": true }),
    )?;
    let target = format!("nbd:127.0.0.1:{port}:exportname={DRIVE}");
    let args = json!({
        "job-id": JOB, "device": DRIVE, "target": target, "sync": "top",
        "format": "raw", "mode": "existing",
    });
    qmp(src, "drive-mirror", args)?;
    let start = Instant::now();
    loop {
        let jobs = qmp(src, "query-block-jobs", json!({}))?;
        let job = jobs
            .as_array()
            .and_then(|a| a.iter().find(|j| j["device"] == JOB));
        let Some(job) = job else {
            return Err(BenchError::Failed(
                "the drive-mirror job vanished before it was ready".into(),
            ));
        };
        if job["ready"] == true {
            return Ok(job["offset"].as_u64().unwrap_or(0));
        }
        if start.elapsed() > p.timeout {
            return Err(BenchError::Failed(format!(
                "drive-mirror not ready within {:?}",
                p.timeout
            )));
        }
        std::thread::sleep(POLL);
    }
}

/// Cancels the ready mirror (the copy stays consistent) and waits until the job is gone.
fn finish_mirror(src: &mut RawVm, timeout: Duration) -> Result<(), BenchError> {
    qmp(src, "block-job-cancel", json!({ "device": JOB }))?;
    let start = Instant::now();
    loop {
        let jobs = qmp(src, "query-block-jobs", json!({}))?;
        if !jobs
            .as_array()
            .is_some_and(|a| a.iter().any(|j| j["device"] == JOB))
        {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(BenchError::Failed(
                "the mirror job did not end after its cancel".into(),
            ));
        }
        std::thread::sleep(POLL);
    }
}

fn wait_migration(src: &mut RawVm, timeout: Duration) -> Result<Value, BenchError> {
    let start = Instant::now();
    loop {
        let info = qmp(src, "query-migrate", json!({}))?;
        match info["status"].as_str().unwrap_or("") {
            "completed" => return Ok(info),
            "failed" | "cancelled" => {
                return Err(BenchError::Failed(format!(
                    "raw QEMU migration failed: {info}"
                )));
            }
            _ if start.elapsed() > timeout => {
                let _ = qmp(src, "migrate_cancel", json!({}));
                return Err(BenchError::Failed(format!(
                    "raw QEMU migration not done within {timeout:?}"
                )));
            }
            _ => std::thread::sleep(POLL),
        }
    }
}

fn wait_running(vm: &mut RawVm, timeout: Duration) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        let st = qmp(vm, "query-status", json!({}))?;
        if st["status"] == "running" {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(BenchError::Failed(format!(
                "the destination is {st}, not running"
            )));
        }
        std::thread::sleep(POLL);
    }
}
