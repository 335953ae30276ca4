//! Launch latency: `vse launch IMAGE --allocation local:2 -- true` against two plain QEMU boots
//! of the same image started in parallel (boot to init, as `vse bench build` measures one), in
//! the same run. The launch report's timeline says where vse's time goes: agents, staging
//! (the image is already in the node cache after a warm-up launch), VM boot up to the rank's
//! first word, and teardown.
//!
//! Boot templates ([`TemplateLatency`]): time from `vse launch` to the first rank output for
//! 1 and 4 VMs on one node, booting cold (`--no-template`) against starting from the node's
//! boot template of the image (saved by the launch before), next to one plain QEMU boot of
//! the same image. Goal: from a template, first output in under a third of the cold time.

use crate::{BenchError, Step};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Latency {
    Measured {
        image: PathBuf,
        accel: String,
        rounds: Vec<Round>,
        /// Medians over the rounds.
        vse_ms: u64,
        plain_pair_ms: u64,
        plain_pair_devices_ms: u64,
        /// vse ÷ the two plain boots (goal ≤ 1.2).
        ratio: f64,
        /// vse ÷ the two plain boots with vse's devices: what vse adds beyond the guest's
        /// own boot on the same virtual hardware.
        ratio_same_devices: f64,
        templates: TemplateLatency,
    },
    Skipped {
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub vse_ms: u64,
    /// Until both plain QEMU boots ended.
    pub plain_pair_ms: u64,
    /// The same with the two devices every vse VM has and the plain boot has not: the guest
    /// agent's virtio-serial channel and the job network's NIC.
    pub plain_pair_devices_ms: u64,
    /// The launch report's `timeline`: when each phase began, ms from the launch's start.
    pub timeline: serde_json::Value,
    /// Each rank's `times` from the report: VM start, guest boot to its agent, the command,
    /// the VM's stop, on its node.
    pub rank_times: Vec<serde_json::Value>,
}

/// The minimal test image (`tests/` build it into `$VSE_CACHE`), when present.
pub fn default_image() -> Option<PathBuf> {
    let img = vse_base::cache_root().join("vse-test-image-minimal");
    img.join("manifest.json").is_file().then_some(img)
}

pub fn measure(image: Option<&Path>, rounds: u32, step: Step) -> Result<Latency, BenchError> {
    let Some(img) = image.map(Path::to_path_buf).or_else(default_image) else {
        return Ok(Latency::Skipped {
            reason: "no image: pass --latency-image DIR (or build the tests' minimal image)".into(),
        });
    };
    let image = vse_image::ImageDir::open(&img)?;
    let qemu = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).ok_or_else(|| {
        BenchError::Failed("qemu-system-x86_64 not found (apt-get install qemu-system-x86)".into())
    })?;
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-latency-")
        .tempdir_in("/tmp")?;
    let accel = v2m::qemu::accel::choose(
        v2m::qemu::AccelPolicy::Auto,
        &qemu,
        image.kernel(),
        tmp.path(),
    );
    let accel = accel.accel.as_str().to_string();
    step("launch latency: warm-up launch (stages the image into the node cache)");
    launch(&img, tmp.path())?;
    let mut out = Vec::new();
    for r in 1..=rounds.max(1) {
        step(&format!("launch latency: round {r}, vse launch"));
        let (vse_ms, timeline, rank_times) = launch(&img, tmp.path())?;
        step(&format!("launch latency: round {r}, two plain QEMU boots"));
        let plain_pair_ms = plain_pair(&image, &accel, &[])?;
        step(&format!(
            "launch latency: round {r}, two plain QEMU boots with vse's devices"
        ));
        let plain_pair_devices_ms = plain_pair(&image, &accel, VSE_DEVICES)?;
        out.push(Round {
            vse_ms,
            plain_pair_ms,
            plain_pair_devices_ms,
            timeline,
            rank_times,
        });
    }
    let median = |f: fn(&Round) -> u64| {
        crate::stats::median(&out.iter().map(f).collect::<Vec<_>>()).unwrap_or(0)
    };
    let (vse_ms, plain_pair_ms) = (median(|r| r.vse_ms), median(|r| r.plain_pair_ms));
    let plain_pair_devices_ms = median(|r| r.plain_pair_devices_ms);
    let templates = templates(&img, &image, &accel, tmp.path(), step)?;
    Ok(Latency::Measured {
        templates,
        image: img,
        accel,
        ratio: crate::stats::ratio(vse_ms as f64, plain_pair_ms as f64, 1.0),
        ratio_same_devices: crate::stats::ratio(vse_ms as f64, plain_pair_devices_ms as f64, 1.0),
        rounds: out,
        vse_ms,
        plain_pair_ms,
        plain_pair_devices_ms,
    })
}

/// QEMU arguments of the devices a vse VM carries beyond the plain boot's disk: the guest
/// agent's channel (virtio-serial, its port on a null backend: no agent runs) and a NIC.
const VSE_DEVICES: &[&str] = &[
    "-device",
    "virtio-serial-pci,id=vser0",
    "-device",
    "virtserialport,bus=vser0.0,chardev=agent,name=org.vse.agent.0",
    "-chardev",
    "null,id=agent",
    "-netdev",
    "user,id=net0,restrict=on",
    "-device",
    "virtio-net-pci,netdev=net0",
];

/// Two plain QEMU boots of the image started at once: ms until both ended.
fn plain_pair(
    image: &vse_image::ImageDir,
    accel: &str,
    extra: &'static [&'static str],
) -> Result<u64, BenchError> {
    let t = Instant::now();
    let pair: Vec<_> = (0..2)
        .map(|_| {
            let (image, accel) = (image.clone(), accel.to_string());
            std::thread::spawn(move || crate::build::plain_boot(&image, &accel, extra))
        })
        .collect();
    for p in pair {
        p.join()
            .map_err(|_| BenchError::Failed("plain QEMU boot thread panicked".into()))??;
    }
    Ok(t.elapsed().as_millis() as u64)
}

/// One `vse launch … -- true` of this process's own binary: wall time, the timeline and the
/// ranks' times. Its VMs boot cold, as the plain QEMU boots they are compared with.
fn launch(
    img: &Path,
    dir: &Path,
) -> Result<(u64, serde_json::Value, Vec<serde_json::Value>), BenchError> {
    let args = ["--allocation", "local:2", "--no-template"];
    let (ms, report, _) = launch_with(img, dir, &args, &["true"], &[])?;
    let times = (report["ranks"].as_array().into_iter().flatten())
        .map(|r| r["times"].clone())
        .collect();
    Ok((ms, report["timeline"].clone(), times))
}

/// `vse launch IMAGE ARGS --json -- CMD`: wall time, the report and what it said on stderr.
fn launch_with(
    img: &Path,
    dir: &Path,
    args: &[&str],
    cmd: &[&str],
    env: &[(&str, &Path)],
) -> Result<(u64, serde_json::Value, String), BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::io("finding the vse binary"))?;
    let t = Instant::now();
    let o = Command::new(exe)
        .arg("launch")
        .arg(img)
        .args(args)
        .arg("--json")
        .arg("--")
        .args(cmd)
        .env("VSE_RUN_DIR", dir.join("run"))
        .env("VSE_STATE_DB", dir.join("state.db"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(BenchError::io("running vse launch"))?;
    let ms = t.elapsed().as_millis() as u64;
    if !o.status.success() {
        return Err(BenchError::Failed(format!(
            "vse launch exited with {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|e| BenchError::Failed(format!("vse launch --json: {e}")))?;
    Ok((ms, report, String::from_utf8_lossy(&o.stderr).into_owned()))
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (accel, rounds, vse_ms, plain_pair_ms, ratio, same) = match self {
            Latency::Measured {
                accel,
                rounds,
                vse_ms,
                plain_pair_ms,
                ratio,
                plain_pair_devices_ms,
                ratio_same_devices,
                ..
            } => (
                accel,
                rounds,
                vse_ms,
                plain_pair_ms,
                ratio,
                (plain_pair_devices_ms, ratio_same_devices),
            ),
            Latency::Skipped { reason } => {
                return writeln!(f, "launch latency: not measured: {reason}");
            }
        };
        writeln!(
            f,
            "launch latency ({accel}, local:2, `-- true`, image cached): vse {vse_ms} ms, two plain QEMU boots in parallel {plain_pair_ms} ms → {ratio:.2}x (medians of {})",
            rounds.len()
        )?;
        writeln!(
            f,
            "  two plain boots with vse's devices (agent channel, NIC) {} ms → {:.2}x",
            same.0, same.1
        )?;
        for r in rounds {
            let phases: Vec<String> = (r.timeline.as_array().into_iter().flatten())
                .map(|m| format!("{} @{}", m["phase"].as_str().unwrap_or("?"), m["at_ms"]))
                .collect();
            writeln!(f, "  vse {} ms: {}", r.vse_ms, phases.join(", "))?;
            for (i, t) in r.rank_times.iter().enumerate() {
                writeln!(
                    f,
                    "    rank {i}: VM start {} ms, guest to its agent {} ms, command {} ms, VM stop {} ms",
                    t["vm_start_ms"], t["guest_ms"], t["run_ms"], t["stop_ms"]
                )?;
            }
        }
        if let Latency::Measured { templates, .. } = self {
            write!(f, "{templates}")?;
        }
        Ok(())
    }
}

/// `vse launch` to first rank output, cold against from a boot template.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateLatency {
    /// One plain QEMU boot of the image to init, in the same run.
    pub plain_boot_ms: u64,
    pub cases: Vec<TemplateCase>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TemplateCase {
    pub vms: u32,
    /// `vse launch --no-template`: ms from the launch's start to the first rank output.
    pub cold_ms: u64,
    /// The launch that booted cold and saved the template (the save pauses the VM once).
    pub saving_ms: u64,
    /// The launch whose VMs started from the template.
    pub template_ms: u64,
    /// template ÷ cold (goal < 0.33).
    pub ratio: f64,
}

/// Per VM count: a fresh node cache, a warm-up launch (stages the image, no template), a
/// cold launch, one that saves the template, one from it.
fn templates(
    img: &Path,
    image: &vse_image::ImageDir,
    accel: &str,
    dir: &Path,
    step: Step,
) -> Result<TemplateLatency, BenchError> {
    step("boot templates: one plain QEMU boot");
    let plain_boot_ms = crate::build::plain_boot(image, accel, &[])?.as_millis() as u64;
    let policy = dir.join("bench.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: bench-templates\nlimits:\n  vms_per_core: 4\n",
    )
    .map_err(BenchError::io("writing the benchmark's policy"))?;
    let mut cases = Vec::new();
    for vms in [1u32, 4] {
        let cache = dir.join(format!("node-cache-{vms}"));
        let n = vms.to_string();
        let policy = policy.to_string_lossy();
        let args = [
            "--allocation",
            "local:1",
            "--vms-per-node",
            &n,
            "--policy",
            &policy,
        ];
        let env = [("VSE_IMAGE_CACHE", cache.as_path())];
        let first = |extra: &[&str], what: &str| -> Result<(u64, String), BenchError> {
            step(&format!("boot templates: {vms} VM(s), {what}"));
            let args: Vec<&str> = args.iter().chain(extra).copied().collect();
            let (_, report, stderr) = launch_with(img, dir, &args, &["echo", "up"], &env)?;
            first_output(&report)
                .map(|ms| (ms, stderr))
                .ok_or_else(|| BenchError::Failed(format!("{what}: no first output in {report}")))
        };
        first(&["--no-template"], "warm-up (staging)")?;
        let (cold_ms, _) = first(&["--no-template"], "cold boot")?;
        let (saving_ms, _) = first(&[], "cold boot saving the template")?;
        let (template_ms, stderr) = first(&[], "from the template")?;
        if stderr.contains("boot template") {
            return Err(BenchError::Failed(format!(
                "{vms} VM(s): not every VM started from the template: {stderr}"
            )));
        }
        cases.push(TemplateCase {
            vms,
            cold_ms,
            saving_ms,
            template_ms,
            ratio: crate::stats::ratio(template_ms as f64, cold_ms as f64, 1.0),
        });
    }
    Ok(TemplateLatency {
        plain_boot_ms,
        cases,
    })
}

/// The launch report's "first output" mark.
fn first_output(report: &serde_json::Value) -> Option<u64> {
    (report["timeline"].as_array()?.iter()).find(|m| m["phase"] == "first output")?["at_ms"]
        .as_u64()
}

impl std::fmt::Display for TemplateLatency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "boot templates (`vse launch` to first rank output, one node; plain QEMU boot of the image {} ms):",
            self.plain_boot_ms
        )?;
        for c in &self.cases {
            writeln!(
                f,
                "  {} VM(s): cold {} ms, from template {} ms → {:.2}x (goal < 0.33); the launch saving it {} ms",
                c.vms, c.cold_ms, c.template_ms, c.ratio, c.saving_ms
            )?;
        }
        Ok(())
    }
}
