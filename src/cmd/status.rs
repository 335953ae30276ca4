//! `vse status [JOB] [--json]`: nodes and pools, VMs and their placement, latest samples and
//! migrations, read from the controller's state database. `--serve [ADDR]` serves the same as a
//! live page (the vse-status crate).

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
    /// Serve a live page instead (also /api/status, /api/events, /metrics) on ADDR
    /// (`IP:PORT` or `PORT`; default 127.0.0.1:8787, port 0 picks one).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:8787")]
    serve: Option<String>,
    /// File whose first line is the token clients must present (`Authorization: Bearer`, or
    /// the page's sign-in, or a link ending in `#token=TOKEN`); needed off loopback and for a
    /// state DB another account owns.
    #[arg(long, requires = "serve")]
    token_file: Option<PathBuf>,
}

fn serve(a: &StatusArgs, addr: &str) -> Result<ExitCode> {
    use vse_status::{ServeOptions, StatusError, auth::Token};
    let invalid = |e: StatusError| match e {
        StatusError::Invalid(m) => anyhow::Error::from(Failure::invalid(m)),
        e => anyhow::Error::from(e),
    };
    let addr = addr
        .parse()
        .or_else(|_| addr.parse::<u16>().map(|p| ([127, 0, 0, 1], p).into()))
        .map_err(|_| Failure::invalid(format!("--serve {addr}: expected IP:PORT or PORT")))?;
    let token = a.token_file.as_deref().map(Token::from_file).transpose();
    let opts = ServeOptions {
        db: a.db.clone(),
        addr,
        token: token.map_err(invalid)?,
        period: std::time::Duration::from_millis(500),
    };
    vse_status::serve_blocking(opts, |at| {
        println!("vse status: serving http://{at}/ (JSON at /api/status, metrics at /metrics)");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })
    .map_err(invalid)?;
    Ok(ExitCode::SUCCESS)
}

fn gib(kib: u64) -> String {
    format!("{:.1}G", kib as f64 / (1024.0 * 1024.0))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn run(a: StatusArgs) -> Result<ExitCode> {
    if let Some(addr) = &a.serve {
        if a.job.is_some() || a.json {
            return Err(
                Failure::invalid("--serve shows every job as a page; drop JOB and --json").into(),
            );
        }
        return serve(&a, addr);
    }
    if let Some(exit) = super::owner::as_owner(&a.db, None)? {
        return Ok(exit);
    }
    let job = a
        .job
        .as_deref()
        .map(JobId::new)
        .transpose()
        .map_err(|e| Failure::invalid(format!("job argument: {e}")))?;
    match control::locate::reachable(&a.db) {
        Err(control::locate::FindJobError::NoDb(_)) => {
            return Err(Failure::invalid(format!(
                "state database {} does not exist; hint: pass --db or set VSE_STATE_DB to the \
                 controller's database",
                a.db.display()
            ))
            .into());
        }
        Err(e) => return Err(Failure::invalid(e.to_string()).into()),
        Ok(()) => {}
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
            .map(|mv| match &mv.transfer {
                Some(t) => format!(
                    "{}→{} ({}, disk {}, memory {}, downtime {} ms, total {} ms)",
                    mv.vm,
                    mv.dest,
                    t.storage,
                    mib(t.disk_bytes),
                    mib(t.memory_bytes),
                    t.downtime_ms,
                    t.total_ms
                ),
                None => format!("{}→{}", mv.vm, mv.dest),
            })
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
