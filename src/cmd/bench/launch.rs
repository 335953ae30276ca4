//! `vse bench launch`: the launcher's figures. (1) tree bootstrap of many agents simulated in one
//! process over loopback with the real protocol code; (3) failure-detection latency.
//! Part (2), image staging against a linear copy and sbcast, needs the staging layer and is not
//! measured yet: the report says so instead of printing a number.

use anyhow::Result;
use clap::Args;
use launcher::{
    agent::{Timing, sim::Fault},
    bench,
};
use std::{process::ExitCode, time::Duration};

#[derive(Debug, Args)]
pub struct LaunchBench {
    /// Agent counts for the bootstrap benchmark.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    agents: Vec<u32>,
    /// Tree fan-outs to compare.
    #[arg(long, value_delimiter = ',', default_value = "2,8")]
    k: Vec<u32>,
    /// Repetitions of each failure-detection measurement.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: LaunchBench) -> Result<ExitCode> {
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let step = |m: String| {
        if let Some(b) = &bar {
            b.set_message(m);
        }
    };
    let mut boot = Vec::new();
    for &k in &a.k {
        for &n in &a.agents {
            step(format!("bootstrap: {n} agents, k={k}"));
            boot.push(bench::bootstrap(n, k)?);
        }
    }
    let timing = Timing {
        handshake: Duration::from_secs(10),
        heartbeat: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
    };
    let mut detect = Vec::new();
    for fault in [Fault::Crash, Fault::Freeze] {
        step(format!("failure detection: {fault:?}"));
        detect.push(bench::detection(64, 2, fault, timing, a.rounds)?);
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let staging = "not measured: image staging is not implemented yet";
    if a.json {
        let doc = serde_json::json!({ "bootstrap": boot, "detection": detect, "staging": staging });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("bootstrap (in-process agents, loopback, real protocol):");
    println!(
        "{:>8} {:>3} {:>6} {:>10} {:>14}",
        "agents", "k", "depth", "total s", "s per level"
    );
    for b in &boot {
        println!(
            "{:>8} {:>3} {:>6} {:>10.3} {:>14.4}",
            b.agents, b.k, b.depth, b.seconds, b.seconds_per_level
        );
    }
    println!("failure detection (64 agents, heartbeat 100 ms, timeout 500 ms), front-end latency:");
    for d in &detect {
        let ms: Vec<String> = d.latency_ms.iter().map(|m| format!("{m:.0} ms")).collect();
        let what = if d.fault == "Crash" {
            "crash (connection closed / child exit)"
        } else {
            "hang (heartbeat)"
        };
        println!("  {what:<40} {}", ms.join(", "));
    }
    println!("staging: {staging}");
    Ok(ExitCode::SUCCESS)
}
