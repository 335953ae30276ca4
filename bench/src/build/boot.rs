//! Boot-to-agent-ready of the built image through vmhost, next to a plain QEMU boot of the
//! same kernel, initramfs and root disk up to the image's init.

use super::{BuildBench, Row};
use crate::{BenchError, Step};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(super) fn boot_figures(
    a: &BuildBench,
    img: &Path,
    step: Step,
    row: &mut Row,
) -> Result<(), BenchError> {
    let image = vse_image::ImageDir::open(img)?;
    let plugin = v2m::qemu::QemuPlugin::new(v2m::qemu::QemuConfig {
        run_root: img.with_extension("run"),
        ephemeral: true,
        ..v2m::qemu::QemuConfig::default()
    });
    let spec = vmhost::VmSpec::new(&image, "bench-boot".parse()?, 1, 512);
    let opts = vmhost::BootOptions::new("bench", Duration::from_secs(300));
    // Boot to agent ready; returns the time and the accelerator V2M chose.
    let ready = || -> Result<(Duration, String), BenchError> {
        let t = Instant::now();
        let mut vm = vmhost::boot(&plugin, &spec, &opts)?;
        let took = t.elapsed();
        let accel = vm.vm_mut().status()?.accel.unwrap_or_default();
        let _ = vm.stop(Duration::from_secs(10));
        Ok((took, accel))
    };
    // Warm-up boot: the first one pays for the KVM functional check and cold page caches.
    let (_, accel) = ready()?;
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    // Each pair boots at the same time (one TCG vCPU each on a 2-core machine), so both sides
    // see the same background load: sequential runs on a shared machine drift by more than
    // the overhead being measured.
    for _ in 0..a.boot_runs.max(1) {
        step("boot to agent ready, next to a plain QEMU boot to init");
        let plain_side = {
            let (image, accel) = (image.clone(), accel.clone());
            std::thread::spawn(move || plain_boot(&image, &accel, &[]))
        };
        ours.push(ready()?.0.as_millis() as u64);
        let p = plain_side
            .join()
            .map_err(|_| BenchError::Failed("plain QEMU boot thread panicked".into()))??;
        plain.push(p.as_millis() as u64);
    }
    let o = crate::stats::median(&ours).unwrap_or(0);
    let p = crate::stats::median(&plain).unwrap_or(0);
    row.boot_accel = Some(accel);
    row.boot_to_agent_ready_ms = Some(o);
    row.plain_boot_to_init_ms = Some(p);
    row.boot_overhead_pct = Some((o as f64 - p as f64) * 100.0 / p.max(1) as f64);
    Ok(())
}

/// The same kernel, initramfs and root disk on a plain QEMU command line, with
/// `vse.init=/usr/bin/true`: the initramfs mounts the root and hands over to an init that
/// exits at once, the kernel panics with `panic=-1` and `-no-reboot` ends QEMU. The time to
/// QEMU's exit is boot-to-init without any vse machinery. `extra` adds QEMU arguments (devices).
pub(crate) fn plain_boot(
    image: &vse_image::ImageDir,
    accel: &str,
    extra: &[&str],
) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let st = Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "pc",
            "-accel",
            accel,
            "-nodefaults",
            "-display",
            "none",
        ])
        .args(["-no-reboot", "-m", "512", "-serial", "null"])
        .arg("-kernel")
        .arg(image.kernel())
        .arg("-initrd")
        .arg(image.initrd())
        .arg("-append")
        .arg(format!("{} vse.init=/usr/bin/true", image.cmdline()))
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,snapshot=on",
            image.root().display()
        ))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(BenchError::io("starting qemu-system-x86_64"))?;
    let took = t.elapsed();
    if !st.success() {
        return Err(BenchError::Failed(format!("plain QEMU exited with {st}")));
    }
    Ok(took)
}
