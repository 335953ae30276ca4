//! `vse bench vm`: V2M figures on the test guest (`.ci/fixtures.sh`), QEMU plugin.
//! Boot-to-ready through the plugin vs the same guest on a plain QEMU command line; pause and
//! resume latency; live migration (256 MiB, 1 GiB, 1 GiB with 600 MiB of random data) against
//! the bound transferred bytes ÷ bandwidth; checkpoint and restore throughput.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use v2m::{ImageRef, MigrationParams, Plugin, Profile, Vm};

#[derive(Debug, Args)]
pub struct VmBench {
    /// Repetitions of the boot and pause/resume measurements.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Migration bandwidth limit, MiB/s (set explicitly on every migration).
    #[arg(long, default_value_t = 1024)]
    bandwidth_mib: u64,
    /// Skip the 1 GiB migrations and checkpoint (quick run).
    #[arg(long)]
    quick: bool,
    /// Fixture env file (default: $VSE_CACHE/fixtures/fixtures.env).
    #[arg(long)]
    fixtures: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Default)]
struct Report {
    accelerator: String,
    boot_plugin_ms: Vec<u64>,
    boot_plain_qemu_ms: Vec<u64>,
    pause_ms: Vec<f64>,
    resume_ms: Vec<f64>,
    migrations: Vec<Migration>,
    checkpoint: Option<Checkpoint>,
}

#[derive(Serialize)]
struct Migration {
    case: String,
    total_ms: u64,
    downtime_ms: u64,
    transferred_mib: f64,
    bound_ms: u64,
}

#[derive(Serialize)]
struct Checkpoint {
    guest_mib: u64,
    file_mib: f64,
    checkpoint_ms: u64,
    checkpoint_mib_s: f64,
    restore_ms: u64,
    restore_mib_s: f64,
}

struct Guest {
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
}

fn guest(path: Option<&Path>) -> Result<Guest> {
    let default =
        PathBuf::from(std::env::var("VSE_CACHE").unwrap_or_else(|_| "/var/cache/vse".into()))
            .join("fixtures/fixtures.env");
    let path = path.map(Path::to_path_buf).unwrap_or(default);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run .ci/fixtures.sh first)", path.display()))?;
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(|v| v.trim_matches('"').to_string())
            .with_context(|| format!("{}: no {k}", path.display()))
    };
    Ok(Guest {
        kernel: get("VSE_FIXTURE_KERNEL")?.into(),
        initrd: get("VSE_FIXTURE_INITRD")?.into(),
        cmdline: get("VSE_FIXTURE_CMDLINE")?,
    })
}

fn profile(g: &Guest, name: &str, mib: u64, extra: &str) -> Result<Profile> {
    let cmdline = format!("{} {extra}", g.cmdline).trim().to_string();
    Ok(Profile::new(
        name.parse()?,
        1,
        mib,
        ImageRef {
            kernel: g.kernel.clone(),
            initrd: Some(g.initrd.clone()),
            root_disk: None,
            cmdline,
        },
    ))
}

fn wait_for(read: impl Fn() -> Vec<u8>, marker: &str, limit: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if String::from_utf8_lossy(&read()).contains(marker) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    bail!("guest did not print {marker} within {limit:?}")
}

fn boot(plugin: &QemuPlugin, p: &Profile) -> Result<(Box<dyn Vm>, Duration)> {
    let t = Instant::now();
    let mut vm = plugin.define(p)?;
    vm.start()?;
    wait_for(
        || vm.console_log().unwrap_or_default(),
        "VSE-READY",
        Duration::from_secs(300),
    )?;
    Ok((vm, t.elapsed()))
}

/// The same guest without V2M: a minimal QEMU command line, console to a file.
fn boot_plain(g: &Guest, dir: &Path, accel: &str) -> Result<Duration> {
    let log = dir.join("plain.log");
    let t = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "pc",
            "-accel",
            accel,
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-m",
            "256M",
        ])
        .arg("-kernel")
        .arg(&g.kernel)
        .arg("-initrd")
        .arg(&g.initrd)
        .args(["-append", &g.cmdline, "-serial"])
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let r = wait_for(
        || std::fs::read(&log).unwrap_or_default(),
        "VSE-READY",
        Duration::from_secs(300),
    );
    let elapsed = t.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&log);
    r.map(|_| elapsed)
}

fn migrate(
    plugin: &QemuPlugin,
    g: &Guest,
    case: &str,
    mib: u64,
    extra: &str,
    bw: u64,
) -> Result<Migration> {
    let (mut src, _) = boot(
        plugin,
        &profile(g, &format!("bench-{case}-src"), mib, extra)?,
    )?;
    let dst = vmhost::Incoming::prepare(
        plugin,
        &profile(g, &format!("bench-{case}-dst"), mib, extra)?,
        std::net::Ipv4Addr::LOCALHOST.into(),
        None,
    )?;
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: bw,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(600),
    };
    let r = vmhost::send(&mut *src, dst.addr(), &params)?;
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

pub fn run(a: VmBench) -> Result<ExitCode> {
    let g = guest(a.fixtures.as_deref())?;
    // Short path under /tmp: QMP and agent unix socket paths must stay below 108 bytes.
    let dir = RunDir(PathBuf::from(format!(
        "/tmp/vsebench-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(dir.path())
        .with_context(|| format!("creating {}", dir.path().display()))?;
    let cfg = QemuConfig {
        run_root: dir.path().to_path_buf(),
        accel: AccelPolicy::Auto,
        ..QemuConfig::default()
    };
    let plugin = QemuPlugin::new(cfg);
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let step = |m: &str| {
        if let Some(b) = &bar {
            b.set_message(m.to_string());
        }
    };
    let mut rep = Report::default();
    let bw = a.bandwidth_mib << 20;
    for i in 0..a.runs {
        step(&format!("boot {}/{}", i + 1, a.runs));
        let mut qvm = plugin.define_qemu(&profile(&g, &format!("bench-boot{i}"), 256, "")?)?;
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
            .push(boot_plain(&g, dir.path(), accel)?.as_millis() as u64);
    }
    let mut cases = vec![("256MiB", 256, "")];
    if !a.quick {
        cases.push(("1GiB", 1024, ""));
        cases.push(("1GiB-dirty", 1024, "vse.dirty_mb=600"));
    }
    for (case, mib, extra) in cases {
        step(&format!("migration {case}"));
        rep.migrations
            .push(migrate(&plugin, &g, case, mib, extra, bw)?);
    }
    if !a.quick {
        step("checkpoint/restore 1 GiB");
        let p = profile(&g, "bench-ckpt", 1024, "vse.dirty_mb=600")?;
        let (mut vm, _) = boot(&plugin, &p)?;
        let file = dir.path().join("bench.ckpt");
        let c = vm.checkpoint(&file)?;
        vm.stop(Duration::ZERO)?;
        drop(vm);
        let t = Instant::now();
        let mut r = plugin.restore(&p, &file)?;
        let restore = t.elapsed();
        r.stop(Duration::ZERO)?;
        let mib = c.bytes as f64 / 1048576.0;
        rep.checkpoint = Some(Checkpoint {
            guest_mib: 1024,
            file_mib: mib,
            checkpoint_ms: c.duration_ms,
            checkpoint_mib_s: mib / (c.duration_ms.max(1) as f64 / 1000.0),
            restore_ms: restore.as_millis() as u64,
            restore_mib_s: mib / restore.as_secs_f64().max(0.001),
        });
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_text(&rep, a.bandwidth_mib);
    }
    Ok(ExitCode::SUCCESS)
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

fn median<T: Copy + PartialOrd>(v: &[T]) -> Option<T> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s.get(s.len() / 2).copied()
}

fn print_text(r: &Report, bw_mib: u64) {
    println!("accelerator: {}", r.accelerator);
    println!(
        "boot to ready: plugin median {} ms {:?}, plain QEMU median {} ms {:?}",
        median(&r.boot_plugin_ms).unwrap_or(0),
        r.boot_plugin_ms,
        median(&r.boot_plain_qemu_ms).unwrap_or(0),
        r.boot_plain_qemu_ms
    );
    println!(
        "pause latency median {:.2} ms, resume latency median {:.2} ms ({} samples)",
        median(&r.pause_ms).unwrap_or(0.0),
        median(&r.resume_ms).unwrap_or(0.0),
        r.pause_ms.len()
    );
    println!("live migration at {bw_mib} MiB/s, downtime limit 300 ms:");
    for m in &r.migrations {
        println!(
            "  {:<11} total {:>6} ms  downtime {:>4} ms  transferred {:>7.1} MiB  bound (bytes/bandwidth) {:>6} ms",
            m.case, m.total_ms, m.downtime_ms, m.transferred_mib, m.bound_ms
        );
    }
    if let Some(c) = &r.checkpoint {
        println!(
            "checkpoint {} MiB guest: {:.0} MiB file in {} ms ({:.0} MiB/s); restore {} ms ({:.0} MiB/s)",
            c.guest_mib,
            c.file_mib,
            c.checkpoint_ms,
            c.checkpoint_mib_s,
            c.restore_ms,
            c.restore_mib_s
        );
    }
}
