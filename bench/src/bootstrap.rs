//! The agent-bootstrap part of `vse bench launch`: N simulated agents split across worker
//! processes (`vse bench sim-worker`, hidden), each well below the open-file limit, over
//! loopback with the real protocol code; per level of the tree, when its last agent was up.
//! Where one process can hold them all (the tree alone, without the overlay), the same
//! bootstrap in one process is measured too, for comparison.

use crate::BenchError;
use agents::bench::{WorkerCommand, multi::MultiFigures};
use serde::Serialize;
use std::{fmt, path::Path};

#[derive(Debug, Clone, Serialize)]
pub struct BootstrapRow {
    #[serde(flatten)]
    pub multi: MultiFigures,
    /// The tree bootstrap (no overlay) of the same agents with every one in one process, the
    /// earlier way of measuring; None when one process cannot hold them.
    pub single_process_s: Option<f64>,
    /// Every agent ready to run the job (tree and overlay), with the workers' start inside the
    /// clock: what a job waits for (goal ≤ 2 s at 10,000 agents).
    pub ready_s: f64,
}

/// What `vse bench sim-worker` runs.
pub fn worker() -> Result<(), BenchError> {
    Ok(agents::bench::worker::serve()?)
}

/// Bootstrap of `agents` agents with fan-out `k`; workers are `vse bench sim-worker` of the
/// binary `vse`, `workers` of them (default: as the open-file limit asks).
pub fn measure(
    agents: u32,
    k: u32,
    workers: Option<u32>,
    vse: &Path,
) -> Result<BootstrapRow, BenchError> {
    let cmd = WorkerCommand {
        program: vse.to_path_buf(),
        args: vec!["bench".into(), "sim-worker".into()],
        env: Vec::new(),
    };
    let multi = agents::bench::multi::bootstrap(agents, k, workers, &cmd)?;
    let single_process_s = match agents::bench::bootstrap(agents, k) {
        Ok(f) => Some(f.seconds),
        Err(agents::bench::BenchError::FdLimit { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    Ok(BootstrapRow {
        ready_s: multi.workers_start_s + multi.overlay_s,
        multi,
        single_process_s,
    })
}

/// The rows as text: one line per run, then where the time went per level.
pub struct Text<'a>(pub &'a [BootstrapRow]);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "bootstrap (simulated agents split across processes, loopback, real protocol; \
             tree and overlay from the front-end's start, ready = workers' start + overlay):"
        )?;
        writeln!(
            f,
            "{:>7} {:>3} {:>5} {:>5} {:>9} {:>10} {:>10} {:>9} {:>13}",
            "agents",
            "k",
            "depth",
            "procs",
            "start s",
            "tree s",
            "overlay s",
            "ready s",
            "1 process s"
        )?;
        for r in self.0 {
            let m = &r.multi;
            writeln!(
                f,
                "{:>7} {:>3} {:>5} {:>5} {:>9.3} {:>10.3} {:>10.3} {:>9.3} {:>13}",
                m.agents,
                m.fanout,
                m.depth,
                m.processes,
                m.workers_start_s,
                m.bootstrap_s,
                m.overlay_s,
                r.ready_s,
                r.single_process_s
                    .map_or("over fd limit".into(), |s| format!("{s:.3}"))
            )?;
            let levels: Vec<String> = m
                .levels
                .iter()
                .map(|l| {
                    format!(
                        "L{} {}: up {:.3} s, overlay {:.3} s",
                        l.level, l.agents, l.up_s, l.overlay_s
                    )
                })
                .collect();
            writeln!(f, "{:>9}{}", "", levels.join("; "))?;
        }
        Ok(())
    }
}
