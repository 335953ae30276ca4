//! The `sbcast` side of `vse bench launch`: the same image broadcast by Slurm to the same
//! number of nodes of the Slurm cluster the run can reach (SLURM_CONF), so the launcher's tree
//! staging is compared with the resource manager's own tool on the same machine, in the same run.
//!
//! `sbcast` writes one copy per node only if DEST is node-local. On the one-machine test
//! cluster `.ci/slurm-up.sh` gives every slurmd a private `/var/tmp/vse-node`; the benchmark
//! checks that the copies really landed in distinct mount namespaces and says so.

use crate::BenchError;
use serde::Serialize;
use std::{
    path::Path,
    process::{Command, Stdio},
};

#[derive(Debug, Clone, Serialize)]
pub struct SbcastFigures {
    pub nodes: u32,
    pub bytes: u64,
    /// `sbcast -f SRC DEST` (with `--compress`: `sbcast -C -f SRC DEST`) inside an allocation
    /// of `nodes` nodes.
    pub seconds: f64,
    pub compressed: bool,
    /// Nodes whose copy has the source's SHA-256 (checked after the timed part).
    pub verified_nodes: u32,
    /// Distinct mount namespaces that received a copy: `nodes` when DEST is node-local.
    pub distinct_mount_namespaces: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Sbcast {
    Measured(SbcastFigures),
    Skipped { nodes: u32, reason: String },
}

fn salloc(nodes: u32) -> Command {
    let mut c = Command::new("salloc");
    c.args(["-Q", "-N", &nodes.to_string(), "--immediate=60"]);
    c.stdin(Stdio::null());
    c
}

type Result<T> = std::result::Result<T, BenchError>;

fn run_ok(mut c: Command, what: &str) -> Result<String> {
    let out = c
        .output()
        .map_err(BenchError::io(format!("starting {what}")))?;
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "{what}: {}; {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Nodes of the reachable cluster that can take a job now, or why there is none.
fn cluster_nodes() -> Result<u32> {
    let mut c = Command::new("sinfo");
    c.args(["-h", "-o", "%D", "-t", "idle,mix,alloc"]);
    let text = run_ok(c, "sinfo").map_err(|e| {
        BenchError::Failed(format!(
            "{e}; hint: start a cluster (`bash .ci/slurm-up.sh 16`) and export SLURM_CONF"
        ))
    })?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .sum())
}

fn sha256sum(path: &Path) -> Result<String> {
    let mut c = Command::new("sha256sum");
    c.arg(path);
    let out = run_ok(c, "sha256sum")?;
    out.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| BenchError::Failed("sha256sum printed nothing".into()))
}

/// Broadcasts `src` to `nodes` nodes at `dest`, verifies every copy, removes them.
pub fn measure(nodes: u32, src: &Path, dest: &Path, compress: bool) -> Sbcast {
    let skipped = |reason: String| Sbcast::Skipped { nodes, reason };
    match cluster_nodes() {
        Err(e) => return skipped(e.to_string()),
        Ok(have) if have < nodes => {
            return skipped(format!(
                "the cluster has {have} usable nodes; hint: `bash .ci/slurm-up.sh {nodes}`"
            ));
        }
        Ok(_) => {}
    }
    match measure_on_cluster(nodes, src, dest, compress) {
        Ok(f) => Sbcast::Measured(f),
        Err(e) => skipped(e.to_string()),
    }
}

fn measure_on_cluster(
    nodes: u32,
    src: &Path,
    dest: &Path,
    compress: bool,
) -> Result<SbcastFigures> {
    let bytes = std::fs::metadata(src)
        .map_err(BenchError::io(src.display().to_string()))?
        .len();
    let want = sha256sum(src)?;
    // One allocation for the broadcast and the check: a second `salloc` may get other nodes
    // while the first job's are still completing. Only sbcast itself is inside the timestamps.
    let script = format!(
        "t0=$(date +%s.%N); sbcast {c}-f {s} {d} || exit 1; t1=$(date +%s.%N); echo \"T $t0 $t1\"; \
         srun -N {nodes} sh -c 'echo \"C $(sha256sum {d} | cut -d\" \" -f1) $(readlink /proc/self/ns/mnt)\"; rm -f {d}'",
        s = src.display(),
        d = dest.display(),
        c = if compress { "-C " } else { "" }
    );
    let mut c = salloc(nodes);
    c.args(["sh", "-c", &script]);
    let report = run_ok(c, "salloc sbcast")?;
    let mut seconds = None;
    let (mut verified_nodes, mut spaces) = (0u32, Vec::new());
    for l in report.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["T", t0, t1] => {
                if let (Ok(a), Ok(b)) = (t0.parse::<f64>(), t1.parse::<f64>()) {
                    seconds = Some(b - a);
                }
            }
            ["C", sha, ns] => {
                verified_nodes += u32::from(*sha == want);
                spaces.push(ns.to_string());
            }
            _ => {}
        }
    }
    spaces.sort_unstable();
    spaces.dedup();
    Ok(SbcastFigures {
        nodes,
        bytes,
        seconds: seconds
            .ok_or_else(|| BenchError::Failed(format!("sbcast printed no timing: {report}")))?,
        compressed: compress,
        verified_nodes,
        distinct_mount_namespaces: spaces.len() as u32,
    })
}
