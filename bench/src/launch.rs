//! `vse bench launch`: the launcher's figures. (1) tree bootstrap and overlay of many agents
//! simulated over loopback with the real protocol code, split across worker processes
//! (`bootstrap.rs`); (2) image staging to N in-process nodes
//! over loopback (pipelined tree vs a linear copy vs one node alone, the bandwidth baseline);
//! (3) failure-detection latency. The same image is also broadcast with Slurm's `sbcast` to
//! as many nodes of the reachable Slurm cluster (see `sbcast.rs`), in the same run.

use crate::bootstrap::{self, BootstrapRow};
use crate::checkpoint::CheckpointBench;
use crate::latency::Latency;
use crate::sbcast::{self, Sbcast};
use crate::{BenchError, Step};
use agents::agent::{Timing, sim::Fault};
use agents::bench::DetectionFigures;
use clap::Args;
use launcher::stage::StagingFigures;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct LaunchBench {
    /// Agent counts for the bootstrap benchmark.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub agents: Vec<u32>,
    /// Tree fan-outs to compare.
    #[arg(long, value_delimiter = ',', default_value = "2,8")]
    pub k: Vec<u32>,
    /// Worker processes for the bootstrap (default: enough to keep each below half the
    /// open-file limit).
    #[arg(long)]
    pub bootstrap_workers: Option<u32>,
    /// Repetitions of each failure-detection measurement.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Node counts for the staging benchmark (the flag alone: skip it).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "4,8,16")]
    pub stage_nodes: Vec<u32>,
    /// Image size for the staging benchmark, MiB (every node writes a copy: N x size on disk).
    #[arg(long, default_value_t = 1024)]
    pub stage_mib: u64,
    /// Directory for the staging benchmark's image and node caches.
    #[arg(long, default_value = "/var/tmp")]
    pub stage_dir: PathBuf,
    /// Node-local destination for the `sbcast` comparison (must be private to each node, as
    /// `.ci/slurm-up.sh` makes /var/tmp/vse-node).
    #[arg(long, default_value = "/var/tmp/vse-node/vse-bench-sbcast.img")]
    pub sbcast_dest: PathBuf,
    /// Skip the `sbcast` comparison.
    #[arg(long)]
    pub no_sbcast: bool,
    /// Image for the launch-latency comparison (default: the tests' minimal image in
    /// $VSE_CACHE, when built).
    #[arg(long, value_name = "DIR")]
    pub latency_image: Option<PathBuf>,
    /// Launch-latency rounds (0: skip it).
    #[arg(long, default_value_t = 3)]
    pub latency_rounds: u32,
    /// Skip the job checkpoint/restore comparison.
    #[arg(long)]
    pub no_checkpoint: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub struct LaunchReport {
    pub bootstrap: Vec<BootstrapRow>,
    pub detection: Vec<DetectionFigures>,
    pub staging: Vec<StagingFigures>,
    pub sbcast: Vec<Sbcast>,
    pub latency: Latency,
    pub checkpoint: CheckpointBench,
}

impl LaunchReport {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "bootstrap": self.bootstrap,
            "detection": self.detection,
            "staging": self.staging,
            "sbcast": self.sbcast,
            "latency": self.latency,
            "checkpoint": self.checkpoint,
        })
    }
}

/// `vse`: the binary whose `bench sim-worker` hosts the bootstrap's agents.
pub fn run(a: &LaunchBench, vse: &Path, step: Step) -> Result<LaunchReport, BenchError> {
    let mut bootstrap = Vec::new();
    for &k in &a.k {
        for &n in &a.agents {
            step(&format!("bootstrap: {n} agents, k={k}"));
            bootstrap.push(bootstrap::measure(n, k, a.bootstrap_workers, vse)?);
        }
    }
    let (mut staging, mut sbcast) = (Vec::new(), Vec::new());
    for &n in &a.stage_nodes {
        step(&format!("staging: {} MiB to {n} nodes", a.stage_mib));
        let work = tempfile::Builder::new()
            .prefix("vse-bench-stage-")
            .tempdir_in(&a.stage_dir)?;
        staging.push(launcher::stage::staging(
            n,
            2,
            a.stage_mib << 20,
            work.path(),
        )?);
        if !a.no_sbcast {
            step(&format!("sbcast: {} MiB to {n} nodes", a.stage_mib));
            let src = work.path().join("image/root.ext4");
            sbcast.push(sbcast::measure(n, &src, &a.sbcast_dest, false));
        }
    }
    let timing = Timing {
        handshake: Duration::from_secs(10),
        heartbeat: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
    };
    let mut detection = Vec::new();
    for fault in [Fault::Crash, Fault::Freeze] {
        step(&format!("failure detection: {fault:?}"));
        detection.push(agents::bench::detection(64, 2, fault, timing, a.rounds)?);
    }
    let latency = if a.latency_rounds == 0 {
        Latency::Skipped {
            reason: "--latency-rounds 0".into(),
        }
    } else {
        crate::latency::measure(a.latency_image.as_deref(), a.latency_rounds, step)?
    };
    let checkpoint = if a.no_checkpoint {
        CheckpointBench::Skipped {
            reason: "--no-checkpoint".into(),
        }
    } else {
        crate::checkpoint::measure(a.latency_image.as_deref(), vse, step)?
    };
    Ok(LaunchReport {
        bootstrap,
        detection,
        staging,
        sbcast,
        latency,
        checkpoint,
    })
}

impl fmt::Display for LaunchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bootstrap::Text(&self.bootstrap))?;
        writeln!(
            f,
            "failure detection (64 agents, heartbeat 100 ms, timeout 500 ms), front-end latency:"
        )?;
        for d in &self.detection {
            let ms: Vec<String> = d.latency_ms.iter().map(|m| format!("{m:.0} ms")).collect();
            let what = if d.fault == "Crash" {
                "crash (connection closed / child exit)"
            } else {
                "hang (heartbeat)"
            };
            writeln!(f, "  {what:<40} {}", ms.join(", "))?;
        }
        self.fmt_staging(f)?;
        write!(f, "{}{}", self.latency, self.checkpoint)
    }
}

impl LaunchReport {
    fn fmt_staging(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "staging (in-process nodes, loopback, k=2, SHA-256 per chunk and whole, fsync):"
        )?;
        writeln!(
            f,
            "{:>6} {:>9} {:>9} {:>10} {:>10} {:>12}",
            "nodes", "MiB", "tree s", "linear s", "1 node s", "tree/1 node"
        )?;
        for s in &self.staging {
            writeln!(
                f,
                "{:>6} {:>9} {:>9.2} {:>10.2} {:>10.2} {:>12.2}",
                s.nodes,
                s.bytes >> 20,
                s.tree_seconds,
                s.linear_seconds,
                s.single_seconds,
                s.tree_vs_single
            )?;
        }
        writeln!(
            f,
            "sbcast (Slurm, same image, same node counts, inside one allocation):"
        )?;
        for r in &self.sbcast {
            match r {
                Sbcast::Measured(m) => {
                    let tree = self.staging.iter().find(|s| s.nodes == m.nodes);
                    writeln!(
                        f,
                        "{:>6} {:>9} {:>9.2} s  ({}/{} copies verified, {} node-local dirs){}",
                        m.nodes,
                        m.bytes >> 20,
                        m.seconds,
                        m.verified_nodes,
                        m.nodes,
                        m.distinct_mount_namespaces,
                        tree.map(|t| format!(
                            "; tree staging {:.2} s = {:.2}x sbcast",
                            t.tree_seconds,
                            t.tree_seconds / m.seconds.max(1e-9)
                        ))
                        .unwrap_or_default()
                    )?;
                }
                Sbcast::Skipped { nodes, reason } => {
                    writeln!(f, "{nodes:>6} not measured: {reason}")?;
                }
            }
        }
        Ok(())
    }
}
