//! `vse bench vm`: V2M figures on the test guest (`.ci/fixtures.sh`), QEMU plugin.
//! Boot-to-ready through the plugin vs the same guest on a plain QEMU command line; pause and
//! resume latency; live migration (256 MiB, 1 GiB, 1 GiB with 600 MiB of random data) against
//! the bound transferred bytes ÷ bandwidth; checkpoint and restore throughput.

mod guest;
mod text;

use crate::{BenchError, Step};
use clap::Args;
use guest::{Guest, boot, boot_plain, profile, wait_for};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use v2m::{MigrationParams, Plugin, Vm};

#[derive(Debug, Args)]
pub struct VmBench {
    /// Repetitions of the boot and pause/resume measurements.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Migration bandwidth limit, MiB/s (set explicitly on every migration).
    #[arg(long, default_value_t = 1024)]
    pub bandwidth_mib: u64,
    /// Skip the 1 GiB migrations and checkpoint (quick run).
    #[arg(long)]
    pub quick: bool,
    /// Fixture env file (default: $VSE_CACHE/fixtures/fixtures.env).
    #[arg(long)]
    pub fixtures: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize, Default)]
pub struct Report {
    pub accelerator: String,
    pub boot_plugin_ms: Vec<u64>,
    pub boot_plain_qemu_ms: Vec<u64>,
    pub pause_ms: Vec<f64>,
    pub resume_ms: Vec<f64>,
    pub migrations: Vec<Migration>,
    pub checkpoint: Option<Checkpoint>,
    /// The bandwidth limit of the migrations, MiB/s (in the text only).
    #[serde(skip)]
    pub bandwidth_mib: u64,
}

#[derive(Debug, Serialize)]
pub struct Migration {
    pub case: String,
    pub total_ms: u64,
    pub downtime_ms: u64,
    pub transferred_mib: f64,
    pub bound_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct Checkpoint {
    pub guest_mib: u64,
    pub file_mib: f64,
    pub checkpoint_ms: u64,
    pub checkpoint_mib_s: f64,
    pub restore_ms: u64,
    pub restore_mib_s: f64,
}

pub fn run(a: &VmBench, step: Step) -> Result<Report, BenchError> {
    let g = Guest::read(a.fixtures.as_deref())?;
    // Short path under /tmp: QMP and agent unix socket paths must stay below 108 bytes.
    let dir = RunDir(PathBuf::from(format!(
        "/tmp/vsebench-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(dir.path())
        .map_err(BenchError::io(format!("creating {}", dir.path().display())))?;
    let plugin = QemuPlugin::new(QemuConfig {
        run_root: dir.path().to_path_buf(),
        accel: AccelPolicy::Auto,
        ..QemuConfig::default()
    });
    let mut rep = Report {
        bandwidth_mib: a.bandwidth_mib,
        ..Report::default()
    };
    for i in 0..a.runs {
        step(&format!("boot {}/{}", i + 1, a.runs));
        boot_and_pause(&plugin, &g, i, dir.path(), &mut rep)?;
    }
    let mut cases = vec![("256MiB", 256, "")];
    if !a.quick {
        cases.push(("1GiB", 1024, ""));
        cases.push(("1GiB-dirty", 1024, "vse.dirty_mb=600"));
    }
    let bw = a.bandwidth_mib << 20;
    for (case, mib, extra) in cases {
        step(&format!("migration {case}"));
        rep.migrations
            .push(migrate(&plugin, &g, case, mib, extra, bw)?);
    }
    if !a.quick {
        step("checkpoint/restore 1 GiB");
        rep.checkpoint = Some(checkpoint(&plugin, &g, dir.path())?);
    }
    Ok(rep)
}

/// One boot through the plugin, five pause/resume pairs, then the same guest on plain QEMU.
fn boot_and_pause(
    plugin: &QemuPlugin,
    g: &Guest,
    i: u32,
    dir: &Path,
    rep: &mut Report,
) -> Result<(), BenchError> {
    let mut qvm = plugin.define_qemu(&profile(g, &format!("bench-boot{i}"), 256, "")?)?;
    let t = Instant::now();
    qvm.start()?;
    wait_for(
        || qvm.console_log().unwrap_or_default(),
        "VSE-READY",
        Duration::from_secs(300),
    )?;
    rep.boot_plugin_ms.push(t.elapsed().as_millis() as u64);
    rep.accelerator = qvm
        .accel()
        .map(|c| format!("{} ({})", c.accel.as_str(), c.reason))
        .unwrap_or_default();
    for _ in 0..5 {
        let t = Instant::now();
        qvm.pause()?;
        rep.pause_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        qvm.resume()?;
        rep.resume_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let accel = qvm.accel().map(|c| c.accel.as_str()).unwrap_or("tcg");
    qvm.stop(Duration::ZERO)?;
    rep.boot_plain_qemu_ms
        .push(boot_plain(g, dir, accel)?.as_millis() as u64);
    Ok(())
}

fn migrate(
    plugin: &QemuPlugin,
    g: &Guest,
    case: &str,
    mib: u64,
    extra: &str,
    bw: u64,
) -> Result<Migration, BenchError> {
    let (mut src, _) = boot(
        plugin,
        &profile(g, &format!("bench-{case}-src"), mib, extra)?,
    )?;
    let dst = vmhost::Incoming::prepare(
        plugin,
        &profile(g, &format!("bench-{case}-dst"), mib, extra)?,
        std::net::Ipv4Addr::LOCALHOST.into(),
        None,
        None,
    )?;
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: bw,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(600),
    };
    // Loopback, and QEMU's own figure is what is measured: the raw stream.
    let r = vmhost::send(&mut *src, dst.addr(), &params, None)?;
    // This guest has no agent to link to: the arrived VM is dropped, which stops it.
    drop(dst.finish(Duration::from_secs(120))?);
    Ok(Migration {
        case: case.to_string(),
        total_ms: r.total_time_ms,
        downtime_ms: r.downtime_ms,
        transferred_mib: r.transferred_bytes as f64 / 1048576.0,
        bound_ms: r.transferred_bytes * 1000 / bw,
    })
}

fn checkpoint(plugin: &QemuPlugin, g: &Guest, dir: &Path) -> Result<Checkpoint, BenchError> {
    let p = profile(g, "bench-ckpt", 1024, "vse.dirty_mb=600")?;
    let (mut vm, _) = boot(plugin, &p)?;
    let file = dir.join("bench.ckpt");
    let c = vm.checkpoint(&file)?;
    vm.stop(Duration::ZERO)?;
    drop(vm);
    let t = Instant::now();
    let mut r = plugin.restore(&p, &file)?;
    let restore = t.elapsed();
    r.stop(Duration::ZERO)?;
    let mib = c.bytes as f64 / 1048576.0;
    Ok(Checkpoint {
        guest_mib: 1024,
        file_mib: mib,
        checkpoint_ms: c.duration_ms,
        checkpoint_mib_s: mib / (c.duration_ms.max(1) as f64 / 1000.0),
        restore_ms: restore.as_millis() as u64,
        restore_mib_s: mib / restore.as_secs_f64().max(0.001),
    })
}

/// Removes the benchmark's run directory (sockets, logs, checkpoint file) on every path.
struct RunDir(PathBuf);

impl RunDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
