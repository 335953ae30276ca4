//! `vse bench resolve`: parse + resolve time against the full Debian index, next to
//! `apt-get install -s` for the same request in the same run.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vsec::deb::{Arch, parse_relation};
use vsec::lock::Reason;
use vsec::repo::ValidityCheck;
use vsec::resolve::apt::AptSandbox;
use vsec::resolve::{
    BaseVariant, RepoConfig, RequestedPackage, ResolveRequest, base_names, load_universe,
    resolve_in,
};
use vsec::solve::Provider;

const DEFAULT_REQUESTS: &[&str] = &[
    "lammps gromacs",
    "python3-scipy python3-pandas python3-matplotlib",
    "build-essential openmpi-bin libopenmpi-dev",
    "octave",
    "r-base-core gfortran cmake",
];

#[derive(Debug, clap::Args)]
pub struct ResolveBench {
    /// A request: package names separated by spaces; repeat the option for several.
    /// Default: five large HPC requests.
    #[arg(long = "request")]
    requests: Vec<String>,
    /// Base variant: essential, minbase or standard.
    #[arg(long, default_value = "minbase")]
    variant: String,
    /// Timed runs per request (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Accept Release files past their Valid-Until.
    #[arg(long)]
    allow_expired: bool,
    /// Print figures as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    request: String,
    vse_packages: usize,
    apt_packages: usize,
    valid: bool,
    vse_resolve_ms: f64,
    vse_parse_plus_resolve_ms: f64,
    apt_warm_ms: f64,
    apt_cold_ms: f64,
    speedup_vs_apt_warm: f64,
    speedup_vs_apt_cold: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn run(b: ResolveBench) -> anyhow::Result<ExitCode> {
    let variant = BaseVariant::parse(&b.variant).ok_or_else(|| {
        crate::exit::Failure::invalid(format!(
            "--variant `{}`: expected essential, minbase or standard",
            b.variant
        ))
    })?;
    let requests: Vec<String> = if b.requests.is_empty() {
        DEFAULT_REQUESTS.iter().map(|s| s.to_string()).collect()
    } else {
        b.requests.clone()
    };
    let runs = b.runs.max(1);
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("valid template"),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb.set_message("verifying and parsing the host's Debian indices");
    let mut cfg = RepoConfig::host(Arch::new("amd64").expect("valid arch"))?;
    if b.allow_expired {
        cfg.validity = ValidityCheck::Ignore;
    }
    cfg.cache_dir = None;
    let t = Instant::now();
    let (u, _) = load_universe(&cfg).context("loading the repositories")?;
    let parse = t.elapsed();
    let base: Vec<String> = base_names(&u, variant)
        .iter()
        .map(|n| n.to_string())
        .collect();
    let sandbox_dir = tempfile::tempdir().context("creating apt's sandbox")?;
    let mut rows = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        let names: Vec<&str> = req.split([' ', ',']).filter(|s| !s.is_empty()).collect();
        let packages = names
            .iter()
            .map(|n| {
                Ok(RequestedPackage {
                    relation: parse_relation(n)?,
                    reason: Reason::Requested,
                })
            })
            .collect::<Result<Vec<_>, vsec::deb::RelationError>>()?;
        let request = ResolveRequest {
            variant,
            recommends: false,
            packages,
            forbidden: vec![],
        };
        pb.set_message(format!("[{}/{}] vse: {req}", i + 1, requests.len()));
        let mut times = Vec::new();
        let mut res = None;
        for _ in 0..runs {
            let t = Instant::now();
            let r = resolve_in(&u, &request)?;
            times.push(t.elapsed());
            res = Some(r);
        }
        let res = res.expect("at least one run");
        let resolve = median(times);
        pb.set_message(format!(
            "[{}/{}] apt-get install -s: {req}",
            i + 1,
            requests.len()
        ));
        // A fresh sandbox per request: the first apt run builds its caches (cold), the
        // following ones reuse them (warm).
        let sandbox = AptSandbox {
            dir: sandbox_dir.path().join(format!("r{i}")),
        };
        let mut apt_names = base.clone();
        apt_names.extend(names.iter().map(|s| s.to_string()));
        let t = Instant::now();
        let apt_set = sandbox
            .simulate(&apt_names)
            .map_err(|e| anyhow::anyhow!("apt-get install -s {req} failed: {e}"))?;
        let cold = t.elapsed();
        let mut warm = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            sandbox
                .simulate(&apt_names)
                .map_err(|e| anyhow::anyhow!("apt-get install -s {req} failed: {e}"))?;
            warm.push(t.elapsed());
        }
        let warm = median(warm);
        let pkgs: Vec<_> = res
            .packages
            .iter()
            .filter_map(|p| {
                u.by_name(p.name.as_str())
                    .iter()
                    .map(|&id| u.package(id))
                    .find(|q| q.version == p.version)
            })
            .collect();
        let valid = sandbox.check(&pkgs).is_ok();
        rows.push(Row {
            request: req.clone(),
            vse_packages: res.packages.len(),
            apt_packages: apt_set.len(),
            valid,
            vse_resolve_ms: ms(resolve),
            vse_parse_plus_resolve_ms: ms(parse + resolve),
            apt_warm_ms: ms(warm),
            apt_cold_ms: ms(cold),
            speedup_vs_apt_warm: warm.as_secs_f64() / resolve.as_secs_f64().max(1e-9),
            speedup_vs_apt_cold: cold.as_secs_f64() / (parse + resolve).as_secs_f64(),
        });
    }
    pb.finish_and_clear();
    if b.json {
        let out = serde_json::json!({
            "universe_packages": u.len(),
            "parse_ms": ms(parse),
            "variant": variant.as_str(),
            "runs": runs,
            "requests": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "indices: {} packages verified + parsed in {:.0} ms (signature, SHA256, lz4, deb822)",
            u.len(),
            ms(parse)
        );
        println!(
            "{:<48} {:>5} {:>5} {:>6} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "request", "vse", "apt", "valid", "vse ms", "apt warm", "apt cold", "x warm", "x cold"
        );
        for r in &rows {
            println!(
                "{:<48} {:>5} {:>5} {:>6} {:>9.1} {:>9.0} {:>9.0} {:>7.1} {:>7.1}",
                r.request,
                r.vse_packages,
                r.apt_packages,
                if r.valid { "yes" } else { "NO" },
                r.vse_resolve_ms,
                r.apt_warm_ms,
                r.apt_cold_ms,
                r.speedup_vs_apt_warm,
                r.speedup_vs_apt_cold
            );
        }
        println!(
            "x warm = apt-get -s with its caches built / vse resolve on the parsed index; x cold = apt-get -s building its caches / vse parse + resolve"
        );
    }
    Ok(if rows.iter().all(|r| r.valid) {
        ExitCode::SUCCESS
    } else {
        vse_exit::Exit::Internal.into()
    })
}
