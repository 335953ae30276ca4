//! `vse bench resolve`: parse + resolve time against the full Debian index, next to
//! `apt-get install -s` for the same request in the same run; and whole processes as a user
//! meets them: `vse lock` with a cold and a warm index cache (and without one) against
//! `apt-get install -s` of the same request, wall time and peak resident set of each.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
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
    /// Packages for the whole-process comparison (`vse lock` of a spec asking for them
    /// against `apt-get install -s` of the lock's roots).
    #[arg(long, default_value = "openmpi-bin libopenmpi-dev lammps")]
    lock_request: String,
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
    let sandbox_dir = tempfile::tempdir().context("creating apt's sandbox")?;
    // First, while this process is small: a child's peak resident set as the kernel reports
    // it is at least this process's own at the time it was started.
    pb.set_message(format!(
        "whole processes: vse lock / apt-get install -s: {}",
        b.lock_request
    ));
    let process = whole_process(&b, runs, sandbox_dir.path())?;
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
            "whole_process": process,
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
        print_process(&process);
    }
    Ok(if rows.iter().all(|r| r.valid) && process.same_packages {
        ExitCode::SUCCESS
    } else {
        vse_exit::Exit::Internal.into()
    })
}

/// One measured child process.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct Measured {
    pub wall_ms: f64,
    /// The child's own peak resident set (wait4's rusage), KiB.
    pub max_rss_kib: u64,
}

/// Runs `c` to completion with stdout to `stdout`; fails on a non-zero exit.
pub(super) fn run_measured(mut c: Command, stdout: &Path) -> anyhow::Result<Measured> {
    let out =
        std::fs::File::create(stdout).with_context(|| format!("creating {}", stdout.display()))?;
    let err_path = stdout.with_extension("err");
    let err = std::fs::File::create(&err_path)?;
    c.stdin(Stdio::null()).stdout(out).stderr(err);
    let t = Instant::now();
    let child = c.spawn().context("starting the measured command")?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for the child we just spawned, which
    // nothing else reaps (the `Child` handle is dropped without waiting).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    drop(child);
    if r != pid {
        anyhow::bail!("wait4: {}", std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        anyhow::bail!(
            "{:?} failed (status {status:#x}): {}",
            c.get_program(),
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
    }
    Ok(Measured {
        wall_ms: ms(wall),
        max_rss_kib: ru.ru_maxrss as u64,
    })
}

#[derive(Debug, serde::Serialize)]
struct Process {
    request: String,
    packages: usize,
    apt_packages: usize,
    /// apt would install exactly the locked packages.
    same_packages: bool,
    /// Medians over the runs.
    vse_lock_no_cache: Measured,
    vse_lock_cold: Measured,
    vse_lock_warm: Measured,
    apt_get_s_cold: Measured,
    apt_get_s_warm: Measured,
    warm_speedup_vs_apt_warm: f64,
    cold_vs_no_cache: f64,
    warm_rss_vs_apt_warm: f64,
    goal_warm_10x_apt: bool,
    goal_warm_rss_below_apt: bool,
    /// This benchmark's own peak resident set when it started the children: the kernel
    /// reports no child peak below it (exec keeps the parent's high-water mark).
    rss_floor_kib: u64,
}

fn median_of(v: &mut [Measured]) -> Measured {
    let mut w: Vec<f64> = v.iter().map(|m| m.wall_ms).collect();
    w.sort_by(f64::total_cmp);
    let mut r: Vec<u64> = v.iter().map(|m| m.max_rss_kib).collect();
    r.sort_unstable();
    Measured {
        wall_ms: w[w.len() / 2],
        max_rss_kib: r[r.len() / 2],
    }
}

/// `vse lock` (no index cache, cold cache, warm cache) and `apt-get install -s` of the same
/// roots, as whole processes; warm runs are interleaved pairs so both see the same load.
fn whole_process(b: &ResolveBench, runs: u32, scratch: &Path) -> anyhow::Result<Process> {
    let dir = scratch.join("process");
    std::fs::create_dir_all(&dir)?;
    let names: Vec<&str> = b.lock_request.split_whitespace().collect();
    let spec = dir.join("bench.vse.yaml");
    std::fs::write(
        &spec,
        format!(
            "version: 1\nname: bench-lock\nbase:\n  distribution: debian\n  suite: bookworm\n  architecture: amd64\n  components: [main]\n  variant: {}\nkernel: linux-image-cloud-amd64\npackages: [{}]\n",
            b.variant,
            names.join(", ")
        ),
    )?;
    let cache = dir.join("cache");
    let lock_path = dir.join("bench.lock");
    let vse_lock = |cache: &Path| -> anyhow::Result<Measured> {
        let mut c = Command::new(std::env::current_exe()?);
        c.env("VSE_CACHE", cache)
            .arg("lock")
            .arg(&spec)
            .arg("-o")
            .arg(&lock_path)
            .arg("--quiet");
        if b.allow_expired {
            c.arg("--allow-expired");
        }
        run_measured(c, &dir.join("vse.out"))
    };
    // Today's behaviour: a cache root that cannot hold the index cache.
    let blocker = dir.join("no-cache");
    std::fs::write(&blocker, b"")?;
    let (mut none, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        none.push(vse_lock(&blocker)?);
        let _ = std::fs::remove_dir_all(&cache);
        cold.push(vse_lock(&cache)?);
    }
    let lock = vsec::lock::Lockfile::read(&lock_path)?;
    let roots: Vec<String> = lock
        .packages
        .iter()
        .filter(|p| !matches!(p.reason, Reason::Dependency { .. }))
        .map(|p| p.name.to_string())
        .collect();
    let sandbox = AptSandbox {
        dir: dir.join("apt"),
    };
    let empty = sandbox.dir.join("empty-status");
    std::fs::create_dir_all(&sandbox.dir)?;
    std::fs::write(&empty, "")?;
    let apt = || {
        let mut c = sandbox.command(&empty);
        c.arg("-s").arg("install").args(&roots);
        run_measured(c, &dir.join("apt.out"))
    };
    let apt_cold = apt()?;
    let apt_names: std::collections::BTreeSet<String> =
        std::fs::read_to_string(dir.join("apt.out"))?
            .lines()
            .filter_map(|l| l.strip_prefix("Inst "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
    let mut apt_warm = Vec::new();
    for _ in 0..runs {
        warm.push(vse_lock(&cache)?);
        apt_warm.push(apt()?);
    }
    let vse_names: std::collections::BTreeSet<String> =
        lock.packages.iter().map(|p| p.name.to_string()).collect();
    let (none, cold, warm, apt_warm) = (
        median_of(&mut none),
        median_of(&mut cold),
        median_of(&mut warm),
        median_of(&mut apt_warm),
    );
    let speedup = apt_warm.wall_ms / warm.wall_ms.max(1e-3);
    let rss_ratio = warm.max_rss_kib as f64 / apt_warm.max_rss_kib.max(1) as f64;
    Ok(Process {
        request: b.lock_request.clone(),
        packages: vse_names.len(),
        apt_packages: apt_names.len(),
        same_packages: vse_names == apt_names,
        vse_lock_no_cache: none,
        vse_lock_cold: cold,
        vse_lock_warm: warm,
        apt_get_s_cold: apt_cold,
        apt_get_s_warm: apt_warm,
        warm_speedup_vs_apt_warm: speedup,
        cold_vs_no_cache: cold.wall_ms / none.wall_ms.max(1e-3),
        warm_rss_vs_apt_warm: rss_ratio,
        goal_warm_10x_apt: speedup >= 10.0,
        goal_warm_rss_below_apt: rss_ratio < 1.0,
        rss_floor_kib: self_max_rss_kib(),
    })
}

fn self_max_rss_kib() -> u64 {
    // SAFETY: getrusage fills the plain-data struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as u64
}

fn print_process(p: &Process) {
    let row = |what: &str, m: &Measured| {
        println!(
            "  {what:<34} {:>9.1} ms {:>9.1} MiB",
            m.wall_ms,
            m.max_rss_kib as f64 / 1024.0
        )
    };
    println!(
        "whole processes, {} ({} packages; apt: {}, {}):",
        p.request,
        p.packages,
        p.apt_packages,
        if p.same_packages {
            "same set"
        } else {
            "DIFFERENT set"
        }
    );
    row("vse lock, no index cache", &p.vse_lock_no_cache);
    row("vse lock, cold index cache", &p.vse_lock_cold);
    row("vse lock, warm index cache", &p.vse_lock_warm);
    row("apt-get install -s, cold", &p.apt_get_s_cold);
    row("apt-get install -s, warm", &p.apt_get_s_warm);
    println!(
        "  warm vse lock is {:.1}x faster than warm apt-get -s (goal 10x) with {:.0}% of its peak memory (goal < 100%); cold is {:.2}x the no-cache time",
        p.warm_speedup_vs_apt_warm,
        p.warm_rss_vs_apt_warm * 100.0,
        p.cold_vs_no_cache
    );
    println!(
        "  (peak memory figures cannot go below {:.1} MiB, this benchmark's own size when it started them)",
        p.rss_floor_kib as f64 / 1024.0
    );
}
