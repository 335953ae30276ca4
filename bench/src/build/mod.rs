//! `vse bench build`: image build times, each case next to its own peer.
//!
//! The headline is like for like: a full build (`vse lock` of the spec, then `vse build` of
//! the lock with no layer, from a warm download cache) against `mmdebstrap` installing the
//! same package names to a tarball from its own warm package cache. Both resolve the names
//! themselves (vse from its warm index cache, mmdebstrap with `apt-get update` and apt's
//! solver). The other cases are their own rows: a warm build (the layer of the package set
//! kept), a no-op rebuild, one package added, one spec file changed. mmdebstrap has no
//! cache of configured roots and no no-op, so a warm, incremental or no-op mmdebstrap run
//! is its full run: that is said next to those rows, never divided into them.
//!
//! Builds run the real `vse build` binary, so the figures include everything a user waits
//! for; each build's report (`--json`) also says where its time went, phase by phase.
//! Goals: the full build 4x faster than mmdebstrap, no-op < 0.5 s, boot overhead < 10%,
//! "add one package" / "change one file" rebuilds within 25% of a full build.

mod boot;
pub(crate) use boot::plain_boot;
mod cases;
mod rebuild;
mod rootless;
mod text;

pub use cases::Case;

use crate::error::Context;
use crate::measure::timed;
use crate::{BenchError, Step};
use imgbuild::build::AgentBinary;
use std::path::{Path, PathBuf};
use std::process::Command;
use vsec::lock::Lockfile;

#[derive(Debug, clap::Args)]
pub struct BuildBench {
    /// Specs to build; default: specs/minimal.vse.yaml and specs/mpi-lammps.vse.yaml.
    #[arg(long = "spec")]
    pub specs: Vec<PathBuf>,
    /// Policies applied to every spec.
    #[arg(long = "policy")]
    pub policies: Vec<PathBuf>,
    /// Static guest agent to bake in instead of the one built into vse.
    #[arg(long, env = "VSE_GUEST_AGENT")]
    pub agent: Option<PathBuf>,
    /// Boots per side for the boot-overhead figure (first spec only; medians reported).
    #[arg(long, default_value_t = 3)]
    pub boot_runs: u32,
    /// Skip the mmdebstrap baseline.
    #[arg(long)]
    pub no_mmdebstrap: bool,
    /// Accept Release files past their Valid-Until.
    #[arg(long)]
    pub allow_expired: bool,
    /// Also time a build of the first spec by this ordinary user (rootless: its subordinate
    /// ids) against root's, both without layers, and compare the images' bytes.
    #[arg(long, value_name = "USER")]
    pub rootless_user: Option<String>,
    /// The package the "add one package" rebuild adds (first spec only).
    #[arg(long, default_value = "tree")]
    pub add_package: String,
    #[arg(long)]
    pub json: bool,
}

/// The figures of one spec.
#[derive(Debug, Default, serde::Serialize)]
pub struct Row {
    pub spec: String,
    pub packages: usize,
    pub download_mib: f64,
    pub lock_s: f64,
    /// Downloads every package, and keeps the configured root as the layer the warm build
    /// finds (its `SaveLayer` phase: what keeping a layer adds to a clean build).
    pub first_build_s: f64,
    pub first_build_phases: Vec<imgbuild::progress::PhaseTime>,
    /// `vse build --no-layers` from a warm download cache: every package unpacked and
    /// configured, no layer read or kept.
    pub full_build_s: f64,
    /// Where the full build's time went, from its `--json` report.
    pub full_build_phases: Vec<imgbuild::progress::PhaseTime>,
    /// `vse lock` + the full build: the side that resolves, like mmdebstrap.
    pub lock_and_full_build_s: f64,
    /// Warm download cache and the layer of this package set.
    pub warm_build_s: f64,
    /// Where the warm build's time went (and the two rebuilds' below).
    pub warm_build_phases: Vec<imgbuild::progress::PhaseTime>,
    pub noop_rebuild_s: f64,
    /// The last image rebuilt with one more package / one spec file changed (first spec).
    pub add_one_package_s: Option<f64>,
    pub add_one_package_root: Option<String>,
    pub change_one_file_s: Option<f64>,
    pub change_one_file_root: Option<String>,
    pub add_one_package_vs_full: Option<f64>,
    pub change_one_file_vs_full: Option<f64>,
    pub add_one_package_phases: Vec<imgbuild::progress::PhaseTime>,
    pub change_one_file_phases: Vec<imgbuild::progress::PhaseTime>,
    /// mmdebstrap of the same package names from its own warm package cache ÷ the full
    /// build alone / ÷ `vse lock` and the full build (the headline: both resolve).
    pub mmdebstrap_vs_full: Option<f64>,
    pub mmdebstrap_vs_lock_and_full: Option<f64>,
    pub mmdebstrap_warm_s: Option<f64>,
    pub boot_accel: Option<String>,
    pub boot_to_agent_ready_ms: Option<u64>,
    pub plain_boot_to_init_ms: Option<u64>,
    pub boot_overhead_pct: Option<f64>,
    /// What `vse launch SPEC` adds before launching when the spec, policies and repositories
    /// are unchanged: check, lock and find the image in the store (first spec).
    pub launch_spec_cache_hit_s: Option<f64>,
    /// `--rootless-user` (first spec): root's build and the user's, both from a warm download
    /// cache without layers, and whether their parts have the same SHA256.
    pub rootless_user: Option<String>,
    pub root_no_layer_build_s: Option<f64>,
    pub rootless_build_s: Option<f64>,
    pub rootless_vs_root: Option<f64>,
    pub rootless_identical: Option<bool>,
    /// Every case next to its own peer (from the figures above).
    pub cases: Vec<Case>,
}

/// Where the benchmark runs: the `vse` binary it times, the guest agent its image-store
/// builds bake in (the binary's own), and where it reports.
pub struct Env<'a> {
    pub vse: &'a Path,
    pub agent: AgentBinary,
    pub step: Step<'a>,
}

/// Measures every spec; `on_row` gets each spec's figures as soon as they are complete.
pub fn run(
    a: &BuildBench,
    env: &Env,
    on_row: &mut dyn FnMut(&Row),
) -> Result<Vec<Row>, BenchError> {
    let specs = if a.specs.is_empty() {
        vec![
            PathBuf::from("specs/minimal.vse.yaml"),
            PathBuf::from("specs/mpi-lammps.vse.yaml"),
        ]
    } else {
        a.specs.clone()
    };
    for s in &specs {
        if !s.exists() {
            return Err(BenchError::Invalid(format!(
                "{}: no such spec; hint: run from the repository root or pass --spec",
                s.display()
            )));
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-build-")
        .tempdir()
        .context("creating a scratch directory")?;
    let mut rows = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let dir = tmp.path().join(format!("s{i}"));
        std::fs::create_dir_all(&dir)?;
        let b = Bench { a, env, dir: &dir };
        let mut row = b.spec(spec)?;
        if i == 0 {
            boot::boot_figures(a, &dir.join("warm.img"), env.step, &mut row)?;
            b.rebuild_figures(spec, &mut row)?;
            let hit = rebuild::launch_spec_hit(a, env, spec)?;
            row.launch_spec_cache_hit_s = Some(hit.as_secs_f64());
            if let Some(user) = &a.rootless_user {
                b.rootless_figures(user, spec, &mut row)?;
            }
        }
        row.cases = cases::of(&row);
        on_row(&row);
        rows.push(row);
        // Images are large (the MPI one is >1 GiB): keep only one at a time.
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(rows)
}

/// One spec's measurements in its scratch directory.
struct Bench<'a> {
    a: &'a BuildBench,
    env: &'a Env<'a>,
    dir: &'a Path,
}

impl Bench<'_> {
    fn vse(&self) -> Command {
        Command::new(self.env.vse)
    }

    fn timed(&self, what: &str, c: Command) -> Result<std::time::Duration, BenchError> {
        timed(what, c, self.env.step)
    }

    /// `vse lock SPEC -o OUT` (with `--add` when given), as the user would run it.
    fn lock_cmd(&self, spec: &Path, out: &Path, add: Option<&str>) -> Command {
        let mut c = self.vse();
        c.arg("lock").arg(spec).arg("-o").arg(out).arg("--quiet");
        if let Some(p) = add {
            c.arg("--add").arg(p);
        }
        for p in &self.a.policies {
            c.arg("--policy").arg(p);
        }
        if self.a.allow_expired {
            c.arg("--allow-expired");
        }
        c
    }

    /// [`Self::build_cmd`] with `--json`, timed: the time and the build's report.
    fn timed_build(
        &self,
        what: &str,
        lock: &Path,
        out: &str,
    ) -> Result<(std::time::Duration, Vec<u8>), BenchError> {
        self.timed_build_with(what, lock, out, &[])
    }

    /// [`Self::timed_build`] with more `vse build` arguments.
    fn timed_build_with(
        &self,
        what: &str,
        lock: &Path,
        out: &str,
        args: &[&str],
    ) -> Result<(std::time::Duration, Vec<u8>), BenchError> {
        let mut c = self.build_cmd(lock, out);
        c.arg("--json").args(args);
        crate::measure::timed_output(what, c, self.env.step)
    }

    /// `vse build LOCK -o DIR/OUT` with the layers in `DIR/vse-cache` and the shared downloads.
    fn build_cmd(&self, lock: &Path, out: &str) -> Command {
        let mut c = self.vse();
        c.env("VSE_CACHE", self.dir.join("vse-cache"))
            .arg("build")
            .arg(lock)
            .arg("-o")
            .arg(self.dir.join(out))
            .arg("--cache")
            .arg(imgbuild::fetch::DebCache::default_root())
            .arg("--quiet");
        if let Some(agent) = &self.a.agent {
            c.arg("--agent").arg(agent);
        }
        c
    }

    fn spec(&self, spec: &Path) -> Result<Row, BenchError> {
        let lock = self.dir.join("env.lock");
        let lock_t = self.timed(
            &format!("vse lock {}", spec.display()),
            self.lock_cmd(spec, &lock, None),
        )?;
        // The builds keep their layers in this scratch directory (their `$VSE_CACHE`), and
        // take `.deb`s from the shared download cache. The first build fills the download
        // cache and keeps the layer the warm build finds; the full build neither reads nor
        // keeps one, as mmdebstrap keeps nothing.
        let (first, first_report) = self.timed_build(
            "vse build (fills the download cache, keeps its layer)",
            &lock,
            "first.img",
        )?;
        let _ = std::fs::remove_dir_all(self.dir.join("first.img"));
        let (full, report) = self.timed_build_with(
            "vse build --no-layers (warm download cache)",
            &lock,
            "full.img",
            &["--no-layers"],
        )?;
        let _ = std::fs::remove_dir_all(self.dir.join("full.img"));
        let (warm, warm_report) = self.timed_build(
            "vse build (warm download cache and layer)",
            &lock,
            "warm.img",
        )?;
        let noop = self.timed(
            "vse build (no-op rebuild)",
            self.build_cmd(&lock, "warm.img"),
        )?;
        let l = Lockfile::read(&lock)?;
        let mut row = Row {
            spec: spec.display().to_string(),
            packages: l.packages.len(),
            download_mib: l.packages.iter().map(|p| p.size).sum::<u64>() as f64 / 1048576.0,
            lock_s: lock_t.as_secs_f64(),
            first_build_s: first.as_secs_f64(),
            first_build_phases: phases_of(&first_report),
            full_build_s: full.as_secs_f64(),
            full_build_phases: phases_of(&report),
            lock_and_full_build_s: (lock_t + full).as_secs_f64(),
            warm_build_s: warm.as_secs_f64(),
            warm_build_phases: phases_of(&warm_report),
            noop_rebuild_s: noop.as_secs_f64(),
            ..Row::default()
        };
        if !self.a.no_mmdebstrap {
            let mm = self.mmdebstrap(&l)?;
            row.mmdebstrap_warm_s = Some(mm.as_secs_f64());
            row.mmdebstrap_vs_full = Some(mm.as_secs_f64() / full.as_secs_f64());
            row.mmdebstrap_vs_lock_and_full = Some(mm.as_secs_f64() / row.lock_and_full_build_s);
        }
        Ok(row)
    }
}

/// The phases of a build's `--json` report (none when it has none).
pub(super) fn phases_of(report: &[u8]) -> Vec<imgbuild::progress::PhaseTime> {
    serde_json::from_slice::<serde_json::Value>(report)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("phases")?.clone()).ok())
        .unwrap_or_default()
}
