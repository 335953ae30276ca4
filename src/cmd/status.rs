//! `vse status [JOB] [--json]`: nodes and pools, VMs and their placement, latest samples and
//! migrations, read from the controller's state database.

use crate::exit::Failure;
use anyhow::{Context, Result};
use clap::Args;
use control::state::StateDb;
use monitor::{JobId, Sample};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Show only this job.
    job: Option<String>,
    /// The controller's state database.
    #[arg(long, env = "VSE_STATE_DB", default_value = "/var/lib/vse/state.db")]
    db: PathBuf,
    /// Migrations to list (newest first).
    #[arg(long, default_value_t = 20)]
    migrations: usize,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

fn gib(kib: u64) -> String {
    format!("{:.1}G", kib as f64 / (1024.0 * 1024.0))
}

pub fn run(a: StatusArgs) -> Result<ExitCode> {
    let job = a
        .job
        .as_deref()
        .map(JobId::new)
        .transpose()
        .map_err(|e| Failure::invalid(format!("job argument: {e}")))?;
    if !a.db.exists() {
        return Err(Failure::invalid(format!(
            "state database {} does not exist; hint: pass --db or set VSE_STATE_DB to the \
             controller's database",
            a.db.display()
        ))
        .into());
    }
    let db = StateDb::open(&a.db).with_context(|| format!("reading {}", a.db.display()))?;
    let vms = db.vms(job.as_ref())?;
    let mut nodes = db.nodes()?;
    if job.is_some() {
        nodes.retain(|n| vms.iter().any(|v| v.node == n.name));
    }
    let mut migrations = db.migrations(job.as_ref(), false)?;
    migrations.truncate(a.migrations);
    let samples: Vec<_> = db
        .latest_samples()?
        .into_iter()
        .filter(|s| nodes.iter().any(|n| n.name.as_str() == s.node))
        .collect();
    if let (Some(j), true) = (&job, vms.is_empty()) {
        return Err(Failure::invalid(format!("job {j} has no VMs in {}", a.db.display())).into());
    }

    if a.json {
        let doc = json!({
            "job": job,
            "nodes": nodes,
            "vms": vms,
            "samples": samples.iter().map(|s| &s.sample).collect::<Vec<_>>(),
            "migrations": migrations,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }

    println!("NODES");
    println!(
        "  {:<20} {:<10} {:>8} {:>8} {:>8} {:>6}",
        "node", "pool", "total", "active", "avail", "cpu%"
    );
    for n in &nodes {
        let s = samples.iter().find_map(|s| match &s.sample {
            Sample::Node(ns) if ns.node == n.name => Some(ns),
            _ => None,
        });
        match s {
            Some(s) => {
                let cpu = if s.cpu.is_empty() {
                    "-".to_string()
                } else {
                    format!(
                        "{:.0}",
                        100.0 * s.cpu.iter().sum::<f64>() / s.cpu.len() as f64
                    )
                };
                println!(
                    "  {:<20} {:<10} {:>8} {:>8} {:>8} {:>6}",
                    n.name.as_str(),
                    n.pool.as_str(),
                    gib(s.mem.total_kib),
                    gib(s.mem.active_kib),
                    gib(s.mem.available_kib),
                    cpu
                );
            }
            None => println!(
                "  {:<20} {:<10} (no sample yet)",
                n.name.as_str(),
                n.pool.as_str()
            ),
        }
    }
    println!("VMS");
    println!(
        "  {:<20} {:<14} {:<20} {:>8} {:>9} {:>12}",
        "vm", "job", "node", "max", "host rss", "guest active"
    );
    for v in &vms {
        let s = samples.iter().find_map(|s| match &s.sample {
            Sample::Vm(vs) if vs.vm == v.vm => Some(vs),
            _ => None,
        });
        let rss = s
            .and_then(|s| s.host.as_ref())
            .map_or("-".into(), |h| gib(h.rss_kib));
        let guest = s
            .and_then(|s| s.guest.as_ref())
            .map_or("-".into(), |g| gib(g.mem.active_kib));
        println!(
            "  {:<20} {:<14} {:<20} {:>8} {:>9} {:>12}",
            v.vm.as_str(),
            v.job.as_str(),
            v.node.as_str(),
            gib(v.mem_max_kib),
            rss,
            guest
        );
    }
    println!("MIGRATIONS");
    if migrations.is_empty() {
        println!("  (none)");
    }
    for m in &migrations {
        let moves: Vec<String> = m
            .moves
            .iter()
            .map(|mv| format!("{}→{}", mv.vm, mv.dest))
            .collect();
        println!(
            "  {:<5} {:<12} {:<28} {} [{}] source {} → {}",
            m.id.to_string(),
            m.state.as_str(),
            m.rule,
            m.source,
            moves.join(", "),
            m.source,
            m.source_fate.as_str()
        );
        if !m.note.is_empty() {
            println!("        {}", m.note);
        }
    }
    Ok(ExitCode::SUCCESS)
}
