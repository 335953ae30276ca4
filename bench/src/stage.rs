//! `vse bench stage`: image staging side by side with what a user would pick instead, in one
//! run, on the same disk: for the real minimal image and an incompressible one of about the
//! same data size, at each node count, the launcher's tree staging (in-process staging
//! servers over loopback, one cache directory per node), Slurm's `sbcast` and `sbcast
//! --compress` on the reachable cluster (see `sbcast.rs`), and the `dd` limit (the same N
//! copies written by N parallel `dd conv=sparse,fsync` on this machine's one disk).

use crate::sbcast::{self, Sbcast};
use crate::{BenchError, Step};
use agents::bench::WorkerCommand;
use clap::Args;
use launcher::stage::{
    DirStaging, LevelFigures, StageOptions, stage_dir, stage_dir_processes, zstd_levels,
};
use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct StageBench {
    /// Node counts.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    pub nodes: Vec<u32>,
    /// The real image to stage (default: $VSE_CACHE/vse-test-image-minimal, as the tests
    /// build it; or `vse build specs/minimal.vse.yaml`'s output).
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Size of the incompressible image, MiB (default: the real image's data size; 0: skip).
    #[arg(long)]
    pub incompressible_mib: Option<u64>,
    /// Tree fan-out.
    #[arg(long, default_value_t = 2)]
    pub k: u32,
    /// zstd level on the wire (0: raw).
    #[arg(long, default_value_t = launcher::stage::DEFAULT_ZSTD_LEVEL)]
    pub level: i32,
    /// Chunks a sender may have in flight before the first is acknowledged.
    #[arg(long, default_value_t = StageOptions::default().window)]
    pub window: u64,
    /// zstd levels to measure on the real image's data chunks (ratio and speed).
    #[arg(long, value_delimiter = ',', default_value = "0,1,3,6")]
    pub levels: Vec<i32>,
    /// Directory for node caches, the incompressible image and the `dd` copies.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Node-local destination for `sbcast` (private to each node, as `.ci/slurm-up.sh` makes
    /// /var/tmp/vse-node).
    #[arg(long, default_value = "/var/tmp/vse-node/vse-bench-stage.img")]
    pub sbcast_dest: PathBuf,
    /// Skip the `sbcast` comparisons.
    #[arg(long)]
    pub no_sbcast: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One image to N nodes, every way, in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub image: String,
    pub nodes: u32,
    pub k: u32,
    pub level: i32,
    /// The image directory's size, holes included (vse stages every file of it).
    pub bytes: u64,
    /// What vse sends and writes: the image's chunks that are not zeros.
    pub data_bytes: u64,
    /// The root file system alone: what `sbcast` and `dd` copy.
    pub root_bytes: u64,
    /// Every node's staging server in the benchmark's process.
    pub vse_s: f64,
    /// Every node's staging server a process of its own, as node agents are (and as `sbcast`
    /// has a `slurmd` per node): like for like with `sbcast` in process structure.
    pub vse_processes_s: f64,
    /// The front-end's pass over the image (hashes, holes) within `vse_s`.
    pub vse_digest_s: f64,
    pub vse_allocated_per_node: u64,
    pub sbcast_s: Option<f64>,
    pub sbcast_compress_s: Option<f64>,
    pub dd_s: f64,
    pub vse_vs_sbcast: Option<f64>,
    /// `vse_processes_s` ÷ `sbcast_s`.
    pub vse_processes_vs_sbcast: Option<f64>,
    pub vse_vs_sbcast_compress: Option<f64>,
    pub vse_vs_dd: f64,
    /// Why an `sbcast` figure is missing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

pub struct StageReport {
    pub levels: Vec<LevelFigures>,
    pub rows: Vec<Row>,
}

impl StageReport {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "zstd_levels": self.levels, "staging": self.rows })
    }
}

fn default_image() -> PathBuf {
    vse_base::cache_root().join("vse-test-image-minimal")
}

pub fn run(a: &StageBench, vse: &Path, step: Step) -> Result<StageReport, BenchError> {
    let image = a.image.clone().unwrap_or_else(default_image);
    if !image.join("root.ext4").is_file() {
        return Err(BenchError::Invalid(format!(
            "{}: no root.ext4; hint: `vse build specs/minimal.vse.yaml` and pass --image",
            image.display()
        )));
    }
    let opts = StageOptions {
        compress: (a.level > 0).then_some(a.level),
        window: a.window,
        ..StageOptions::default()
    };
    step("zstd levels on the real image's data chunks");
    let levels = zstd_levels(&image, opts.chunk_size, &a.levels)?;
    let data = levels.first().map_or(0, |l| l.data_bytes);
    let work = tempfile::Builder::new()
        .prefix("vse-bench-stage-")
        .tempdir_in(&a.dir)
        .map_err(BenchError::io(format!(
            "temporary directory in {}",
            a.dir.display()
        )))?;
    let mut images = vec![("minimal".to_string(), image)];
    let mib = a.incompressible_mib.unwrap_or(data.div_ceil(1 << 20));
    if mib > 0 {
        step(&format!("writing a {mib} MiB incompressible image"));
        let dir = work.path().join("incompressible");
        incompressible(&dir, mib << 20)?;
        images.push(("incompressible".to_string(), dir));
    }
    let mut rows = Vec::new();
    for (name, dir) in &images {
        for &n in &a.nodes {
            rows.push(row(a, opts, (name, dir), n, (work.path(), vse), step)?);
        }
    }
    Ok(StageReport { levels, rows })
}

fn row(
    a: &StageBench,
    opts: StageOptions,
    (name, dir): (&str, &Path),
    n: u32,
    (work, vse): (&Path, &Path),
    step: Step,
) -> Result<Row, BenchError> {
    let root = dir.join("root.ext4");
    let root_bytes = std::fs::metadata(&root)
        .map_err(BenchError::io(root.display().to_string()))?
        .len();
    step(&format!("{name}: dd limit, {n} copies"));
    let dd_s = dd_limit(&root, n, work)?;
    step(&format!("{name}: vse staging to {n} nodes"));
    let v: DirStaging = stage_dir(dir, n, a.k, work, opts)?;
    step(&format!("{name}: vse staging to {n} node processes"));
    let node = WorkerCommand {
        program: vse.to_path_buf(),
        args: vec!["bench".into(), "stage-node".into()],
        env: Vec::new(),
    };
    let p: DirStaging = stage_dir_processes(dir, n, a.k, work, opts, &node)?;
    let mut skipped = Vec::new();
    let mut sb = |compress: bool| {
        if a.no_sbcast {
            return None;
        }
        step(&format!(
            "{name}: sbcast{} to {n} nodes",
            if compress { " -C" } else { "" }
        ));
        match sbcast::measure(n, &root, &a.sbcast_dest, compress) {
            Sbcast::Measured(m) if m.verified_nodes == n => Some(m.seconds),
            Sbcast::Measured(m) => {
                skipped.push(format!(
                    "sbcast{}: only {}/{n} copies verified",
                    if compress { " -C" } else { "" },
                    m.verified_nodes
                ));
                None
            }
            Sbcast::Skipped { reason, .. } => {
                skipped.push(reason);
                None
            }
        }
    };
    let sbcast_s = sb(false);
    let sbcast_compress_s = sb(true);
    let ratio = |p: Option<f64>| p.map(|p| v.seconds / p.max(1e-9));
    Ok(Row {
        image: name.to_string(),
        nodes: n,
        k: a.k,
        level: a.level,
        bytes: v.bytes,
        data_bytes: v.data_bytes,
        root_bytes,
        vse_s: v.seconds,
        vse_processes_s: p.seconds,
        vse_digest_s: v.digest_seconds,
        vse_allocated_per_node: v.allocated_per_node,
        sbcast_s,
        sbcast_compress_s,
        dd_s,
        vse_vs_sbcast: ratio(sbcast_s),
        vse_processes_vs_sbcast: sbcast_s.map(|s| p.seconds / s.max(1e-9)),
        vse_vs_sbcast_compress: ratio(sbcast_compress_s),
        vse_vs_dd: v.seconds / dd_s.max(1e-9),
        skipped,
    })
}

/// An image directory whose root file system is `bytes` of noise (no holes, no zeros).
fn incompressible(dir: &Path, bytes: u64) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(dir.display().to_string()))?;
    let p = dir.join("root.ext4");
    launcher::stage::write_noise(&p, bytes).map_err(BenchError::io(p.display().to_string()))?;
    std::fs::write(dir.join("manifest.json"), b"{}")
        .map_err(BenchError::io(dir.display().to_string()))
}

/// The physical limit: `n` copies of `src` written at once by `dd` (zero blocks skipped,
/// one fsync per copy, as staging does), removed afterwards.
fn dd_limit(src: &Path, n: u32, work: &Path) -> Result<f64, BenchError> {
    let t = Instant::now();
    let mut children = Vec::new();
    for i in 0..n {
        let out = work.join(format!("dd{i}.img"));
        let c = Command::new("dd")
            .arg(format!("if={}", src.display()))
            .arg(format!("of={}", out.display()))
            .args(["bs=1M", "conv=sparse,fsync", "status=none"])
            .spawn()
            .map_err(BenchError::io("starting dd"))?;
        children.push((c, out));
    }
    let mut failed = None;
    for (mut c, _) in children {
        match c.wait() {
            Ok(s) if s.success() => {}
            other => failed = Some(format!("dd: {other:?}")),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    for i in 0..n {
        let _ = std::fs::remove_file(work.join(format!("dd{i}.img")));
    }
    match failed {
        Some(e) => Err(BenchError::Failed(e)),
        None => Ok(secs),
    }
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.prec$}"))
}

impl fmt::Display for StageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "zstd levels over the real image's data chunks (one core):"
        )?;
        writeln!(
            f,
            "{:>6} {:>10} {:>10} {:>12} {:>18}",
            "level", "data MiB", "wire MiB", "encode MB/s", "decode+SHA MB/s"
        )?;
        for l in &self.levels {
            writeln!(
                f,
                "{:>6} {:>10} {:>10} {:>12.0} {:>18.0}",
                l.level,
                l.data_bytes >> 20,
                l.wire_bytes >> 20,
                l.encode_mb_s,
                l.decode_verify_mb_s
            )?;
        }
        writeln!(f, "staging, same run (seconds; ratio = vse / peer):")?;
        writeln!(
            f,
            "{:<15} {:>5} {:>8} {:>8} {:>7} {:>9} {:>9} {:>11} {:>7} {:>8} {:>10} {:>6}",
            "image",
            "nodes",
            "data MiB",
            "root MiB",
            "vse",
            "vse procs",
            "sbcast",
            "sbcast -C",
            "dd",
            "/sbcast",
            "/sbcast -C",
            "/dd"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<15} {:>5} {:>8} {:>8} {:>7.2} {:>9.2} {:>9} {:>11} {:>7.2} {:>8} {:>10} {:>6.2}",
                r.image,
                r.nodes,
                r.data_bytes >> 20,
                r.root_bytes >> 20,
                r.vse_s,
                r.vse_processes_s,
                opt(r.sbcast_s, 2),
                opt(r.sbcast_compress_s, 2),
                r.dd_s,
                opt(r.vse_vs_sbcast, 2),
                opt(r.vse_vs_sbcast_compress, 2),
                r.vse_vs_dd
            )?;
            for s in &r.skipped {
                writeln!(f, "    not measured: {s}")?;
            }
        }
        Ok(())
    }
}
