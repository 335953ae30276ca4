//! The test guest of `.ci/fixtures.sh` (kernel + initramfs that print `VSE-READY`), booted
//! through the plugin or on a plain QEMU command line.

use crate::BenchError;
use crate::fixtures::{EnvFile, default_env_file};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use v2m::qemu::QemuPlugin;
use v2m::{ImageRef, Plugin, Profile, Vm};

pub(super) struct Guest {
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
}

impl Guest {
    /// From the fixtures' env file (`path`, default `$VSE_CACHE/fixtures/fixtures.env`).
    pub(super) fn read(path: Option<&Path>) -> Result<Guest, BenchError> {
        let path = path.map_or_else(|| default_env_file("fixtures.env"), Path::to_path_buf);
        let env = EnvFile::read(&path).map_err(BenchError::io(format!(
            "reading {} (run .ci/fixtures.sh first)",
            path.display()
        )))?;
        Ok(Guest {
            kernel: env.get("VSE_FIXTURE_KERNEL")?.into(),
            initrd: env.get("VSE_FIXTURE_INITRD")?.into(),
            cmdline: env.get("VSE_FIXTURE_CMDLINE")?,
        })
    }
}

pub(super) fn profile(g: &Guest, name: &str, mib: u64, extra: &str) -> Result<Profile, BenchError> {
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

pub(super) fn wait_for(
    read: impl Fn() -> Vec<u8>,
    marker: &str,
    limit: Duration,
) -> Result<(), BenchError> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if String::from_utf8_lossy(&read()).contains(marker) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(BenchError::Failed(format!(
        "guest did not print {marker} within {limit:?}"
    )))
}

pub(super) fn boot(
    plugin: &QemuPlugin,
    p: &Profile,
) -> Result<(Box<dyn Vm>, Duration), BenchError> {
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
pub(super) fn boot_plain(g: &Guest, dir: &Path, accel: &str) -> Result<Duration, BenchError> {
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
        .map_err(BenchError::io("starting qemu-system-x86_64"))?;
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
