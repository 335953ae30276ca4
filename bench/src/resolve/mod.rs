//! `vse bench resolve`: parse + resolve time against the full Debian index, next to
//! `apt-get install -s` for the same request in the same run; and whole processes as a user
//! meets them: `vse lock` with a cold and a warm index cache (and without one) against
//! `apt-get install -s` of the same request, wall time and peak resident set of each.

mod process;
mod text;

use crate::error::Context;
use crate::stats::{median, ms};
use crate::{BenchError, Step};
pub use process::Process;
use std::path::Path;
use std::time::{Duration, Instant};
use vsec::deb::{Arch, parse_relation};
use vsec::lock::Reason;
use vsec::repo::ValidityCheck;
use vsec::resolve::apt::AptSandbox;
use vsec::resolve::{
    BaseVariant, RepoConfig, RequestedPackage, ResolveRequest, base_names, load_universe,
    resolve_in,
};
use vsec::solve::{Provider, Universe};

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
    pub requests: Vec<String>,
    /// Base variant: essential, minbase or standard.
    #[arg(long, default_value = "minbase")]
    pub variant: String,
    /// Timed runs per request (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Accept Release files past their Valid-Until.
    #[arg(long)]
    pub allow_expired: bool,
    /// Packages for the whole-process comparison (`vse lock` of a spec asking for them
    /// against `apt-get install -s` of the lock's roots).
    #[arg(long, default_value = "openmpi-bin libopenmpi-dev lammps")]
    pub lock_request: String,
    /// Print figures as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// One request, solved by vse and by apt.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub request: String,
    pub vse_packages: usize,
    pub apt_packages: usize,
    pub valid: bool,
    pub vse_resolve_ms: f64,
    pub vse_parse_plus_resolve_ms: f64,
    pub apt_warm_ms: f64,
    pub apt_cold_ms: f64,
    pub speedup_vs_apt_warm: f64,
    pub speedup_vs_apt_cold: f64,
}

#[derive(Debug)]
pub struct ResolveReport {
    pub universe_packages: usize,
    pub parse: Duration,
    pub variant: BaseVariant,
    pub runs: u32,
    pub rows: Vec<Row>,
    pub process: Process,
}

impl ResolveReport {
    /// Every solution passed apt's check and `vse lock` locked what apt would install.
    pub fn all_valid(&self) -> bool {
        self.rows.iter().all(|r| r.valid) && self.process.same_packages
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "universe_packages": self.universe_packages,
            "parse_ms": ms(self.parse),
            "variant": self.variant.as_str(),
            "runs": self.runs,
            "requests": self.rows,
            "whole_process": self.process,
        })
    }
}

/// Runs the benchmark; `vse` is the binary whose `vse lock` is timed as a whole process.
pub fn run(b: &ResolveBench, vse: &Path, step: Step) -> Result<ResolveReport, BenchError> {
    let variant = BaseVariant::parse(&b.variant).ok_or_else(|| {
        BenchError::Invalid(format!(
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
    let sandbox_dir = tempfile::tempdir().context("creating apt's sandbox")?;
    // First, while this process is small: a child's peak resident set as the kernel reports
    // it is at least this process's own at the time it was started.
    step(&format!(
        "whole processes: vse lock / apt-get install -s: {}",
        b.lock_request
    ));
    let process = process::whole_process(b, vse, runs, sandbox_dir.path())?;
    step("verifying and parsing the host's Debian indices");
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
    let mut rows = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        let ctx = Request {
            u: &u,
            base: &base,
            variant,
            runs,
            parse,
            label: format!("[{}/{}]", i + 1, requests.len()),
            // A fresh sandbox per request: the first apt run builds its caches (cold), the
            // following ones reuse them (warm).
            sandbox: AptSandbox {
                dir: sandbox_dir.path().join(format!("r{i}")),
            },
        };
        rows.push(ctx.measure(req, step)?);
    }
    Ok(ResolveReport {
        universe_packages: u.len(),
        parse,
        variant,
        runs,
        rows,
        process,
    })
}

/// What measuring one request needs.
struct Request<'a> {
    u: &'a Universe,
    base: &'a [String],
    variant: BaseVariant,
    runs: u32,
    parse: Duration,
    label: String,
    sandbox: AptSandbox,
}

impl Request<'_> {
    fn measure(&self, req: &str, step: Step) -> Result<Row, BenchError> {
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
            variant: self.variant,
            recommends: false,
            packages,
            forbidden: vec![],
        };
        step(&format!("{} vse: {req}", self.label));
        let mut times = Vec::new();
        let mut res = None;
        for _ in 0..self.runs {
            let t = Instant::now();
            let r = resolve_in(self.u, &request)?;
            times.push(t.elapsed());
            res = Some(r);
        }
        let res = res.expect("at least one run");
        let resolve = median(&times).expect("at least one run");
        step(&format!("{} apt-get install -s: {req}", self.label));
        let mut apt_names = self.base.to_vec();
        apt_names.extend(names.iter().map(|s| s.to_string()));
        let apt = |what: &str| {
            let t = Instant::now();
            let r = self
                .sandbox
                .simulate(&apt_names)
                .map_err(|e| BenchError::Failed(format!("apt-get install -s {what} failed: {e}")));
            r.map(|set| (set, t.elapsed()))
        };
        let (apt_set, cold) = apt(req)?;
        let mut warm = Vec::new();
        for _ in 0..self.runs {
            warm.push(apt(req)?.1);
        }
        let warm = median(&warm).expect("at least one run");
        let pkgs: Vec<_> = res
            .packages
            .iter()
            .filter_map(|p| {
                self.u
                    .by_name(p.name.as_str())
                    .iter()
                    .map(|&id| self.u.package(id))
                    .find(|q| q.version == p.version)
            })
            .collect();
        let parse = self.parse;
        Ok(Row {
            request: req.to_string(),
            vse_packages: res.packages.len(),
            apt_packages: apt_set.len(),
            valid: self.sandbox.check(&pkgs).is_ok(),
            vse_resolve_ms: ms(resolve),
            vse_parse_plus_resolve_ms: ms(parse + resolve),
            apt_warm_ms: ms(warm),
            apt_cold_ms: ms(cold),
            speedup_vs_apt_warm: warm.as_secs_f64() / resolve.as_secs_f64().max(1e-9),
            speedup_vs_apt_cold: cold.as_secs_f64() / (parse + resolve).as_secs_f64(),
        })
    }
}
