//! Launch latency: `vse launch IMAGE --allocation local:2 -- true` against two plain QEMU boots
//! of the same image started in parallel (boot to init, as `vse bench build` measures one), in
//! the same run. The launch report's timeline says where vse's time goes: agents, staging
//! (the image is already in the node cache after a warm-up launch), VM boot up to the rank's
//! first word, and teardown.

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
        /// vse ÷ the two plain boots (goal ≤ 1.2).
        ratio: f64,
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
    /// The launch report's `timeline`: when each phase began, ms from the launch's start.
    pub timeline: serde_json::Value,
}

/// The minimal test image (`tests/` build it into `$VSE_CACHE`), when present.
pub fn default_image() -> Option<PathBuf> {
    let cache =
        std::env::var_os("VSE_CACHE").map_or_else(|| "/var/cache/vse".into(), PathBuf::from);
    let img = cache.join("vse-test-image-minimal");
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
        let (vse_ms, timeline) = launch(&img, tmp.path())?;
        step(&format!("launch latency: round {r}, two plain QEMU boots"));
        let t = Instant::now();
        let pair: Vec<_> = (0..2)
            .map(|_| {
                let (image, accel) = (image.clone(), accel.clone());
                std::thread::spawn(move || crate::build::plain_boot(&image, &accel))
            })
            .collect();
        for p in pair {
            p.join()
                .map_err(|_| BenchError::Failed("plain QEMU boot thread panicked".into()))??;
        }
        let plain_pair_ms = t.elapsed().as_millis() as u64;
        out.push(Round {
            vse_ms,
            plain_pair_ms,
            timeline,
        });
    }
    let median = |f: fn(&Round) -> u64| {
        crate::stats::median(&out.iter().map(f).collect::<Vec<_>>()).unwrap_or(0)
    };
    let (vse_ms, plain_pair_ms) = (median(|r| r.vse_ms), median(|r| r.plain_pair_ms));
    Ok(Latency::Measured {
        image: img,
        accel,
        ratio: crate::stats::ratio(vse_ms as f64, plain_pair_ms as f64, 1.0),
        rounds: out,
        vse_ms,
        plain_pair_ms,
    })
}

/// One `vse launch … -- true` of this process's own binary: wall time and the timeline.
fn launch(img: &Path, dir: &Path) -> Result<(u64, serde_json::Value), BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::io("finding the vse binary"))?;
    let t = Instant::now();
    let o = Command::new(exe)
        .arg("launch")
        .arg(img)
        .args(["--allocation", "local:2", "--json", "--", "true"])
        .env("VSE_RUN_DIR", dir.join("run"))
        .env("VSE_STATE_DB", dir.join("state.db"))
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
    Ok((ms, report["timeline"].clone()))
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (accel, rounds, vse_ms, plain_pair_ms, ratio) = match self {
            Latency::Measured {
                accel,
                rounds,
                vse_ms,
                plain_pair_ms,
                ratio,
                ..
            } => (accel, rounds, vse_ms, plain_pair_ms, ratio),
            Latency::Skipped { reason } => {
                return writeln!(f, "launch latency: not measured: {reason}");
            }
        };
        writeln!(
            f,
            "launch latency ({accel}, local:2, `-- true`, image cached): vse {vse_ms} ms, two plain QEMU boots in parallel {plain_pair_ms} ms → {ratio:.2}x (medians of {})",
            rounds.len()
        )?;
        for r in rounds {
            let phases: Vec<String> = (r.timeline.as_array().into_iter().flatten())
                .map(|m| format!("{} @{}", m["phase"].as_str().unwrap_or("?"), m["at_ms"]))
                .collect();
            writeln!(f, "  vse {} ms: {}", r.vse_ms, phases.join(", "))?;
        }
        Ok(())
    }
}
