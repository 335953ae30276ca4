//! `vse bench build`: image build time from a warm cache next to `mmdebstrap` building the
//! same package set to a tarball (also from a warm cache), the no-op rebuild time, and
//! boot-to-agent-ready against a plain QEMU boot of the same kernel, initramfs and root disk
//! up to the image's init.
//!
//! Builds run the real `vse build` binary (this one), so the figures include everything a
//! user waits for. Goals: 2x faster than mmdebstrap, no-op < 0.5 s, boot overhead < 10%;
//! with layers (kept configured roots), a warm build 4x faster than mmdebstrap and "add one
//! package" / "change one file" rebuilds within 25% of a full build. Full builds are timed
//! both with the layer of their package set (what a user's rebuild meets) and without any
//! layer (every package unpacked and configured), side by side.

use crate::exit::Failure;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use vsec::lock::Lockfile;

#[derive(Debug, clap::Args)]
pub struct BuildBench {
    /// Specs to build; default: specs/minimal.vse.yaml and specs/mpi-lammps.vse.yaml.
    #[arg(long = "spec")]
    specs: Vec<PathBuf>,
    /// Policies applied to every spec.
    #[arg(long = "policy")]
    policies: Vec<PathBuf>,
    /// Static guest agent to bake in instead of the one built into vse.
    #[arg(long, env = "VSE_GUEST_AGENT")]
    agent: Option<PathBuf>,
    /// Boots per side for the boot-overhead figure (first spec only; medians reported).
    #[arg(long, default_value_t = 3)]
    boot_runs: u32,
    /// Skip the mmdebstrap baseline.
    #[arg(long)]
    no_mmdebstrap: bool,
    /// Accept Release files past their Valid-Until.
    #[arg(long)]
    allow_expired: bool,
    /// The package the "add one package" rebuild adds (first spec only).
    #[arg(long, default_value = "tree")]
    add_package: String,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Default, serde::Serialize)]
struct Row {
    spec: String,
    packages: usize,
    download_mib: f64,
    lock_s: f64,
    first_build_s: f64,
    /// Warm download cache, no layer: every package unpacked and configured.
    full_build_s: f64,
    /// Warm download cache and the layer of this package set.
    warm_build_s: f64,
    noop_rebuild_s: f64,
    /// The last image rebuilt with one more package / one spec file changed (first spec).
    add_one_package_s: Option<f64>,
    add_one_package_root: Option<String>,
    change_one_file_s: Option<f64>,
    change_one_file_root: Option<String>,
    add_one_package_vs_full: Option<f64>,
    change_one_file_vs_full: Option<f64>,
    mmdebstrap_vs_full: Option<f64>,
    mmdebstrap_warm_s: Option<f64>,
    speedup_vs_mmdebstrap: Option<f64>,
    boot_accel: Option<String>,
    boot_to_agent_ready_ms: Option<u64>,
    plain_boot_to_init_ms: Option<u64>,
    boot_overhead_pct: Option<f64>,
    /// What `vse launch SPEC` adds before launching when the spec, policies and repositories
    /// are unchanged: check, lock and find the image in the store (first spec).
    launch_spec_cache_hit_s: Option<f64>,
}

pub fn run(a: BuildBench) -> Result<ExitCode> {
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
            return Err(Failure::invalid(format!(
                "{}: no such spec; hint: run from the repository root or pass --spec",
                s.display()
            ))
            .into());
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
        let mut row = bench_spec(&a, spec, &dir)?;
        if i == 0 {
            boot_figures(&a, &dir.join("warm.img"), &mut row)?;
            rebuild_figures(&a, spec, &dir, &mut row)?;
            row.launch_spec_cache_hit_s = Some(launch_spec_hit(&a, spec)?.as_secs_f64());
        }
        if !a.json {
            print_row(&row);
        }
        rows.push(row);
        // Images are large (the MPI one is >1 GiB): keep only one at a time.
        let _ = std::fs::remove_dir_all(&dir);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `vse launch SPEC`'s work before the launch, on its second run: the image store
/// (`$VSE_CACHE/images`) then has the image, so this is check + lock + a cache hit.
fn launch_spec_hit(a: &BuildBench, spec: &Path) -> Result<Duration> {
    let prepare = || -> Result<PathBuf> {
        let env = crate::cmd::envload::load_env(spec, &a.policies)?;
        crate::cmd::build::image_for_spec(spec, &a.policies, &env, true)
    };
    eprintln!("bench build: vse launch SPEC's image (fills the image store)");
    prepare()?;
    let t = Instant::now();
    prepare()?;
    Ok(t.elapsed())
}

fn vse() -> Result<Command> {
    Ok(Command::new(
        std::env::current_exe().context("locating the vse binary")?,
    ))
}

fn timed(what: &str, mut c: Command) -> Result<Duration> {
    eprintln!("bench build: {what}");
    let t = Instant::now();
    let out = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {what}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(took)
}

fn bench_spec(a: &BuildBench, spec: &Path, dir: &Path) -> Result<Row> {
    let lock = dir.join("env.lock");
    let mut c = vse()?;
    c.arg("lock").arg(spec).arg("-o").arg(&lock).arg("--quiet");
    for p in &a.policies {
        c.arg("--policy").arg(p);
    }
    if a.allow_expired {
        c.arg("--allow-expired");
    }
    let lock_t = timed(&format!("vse lock {}", spec.display()), c)?;
    // The builds keep their layers in this scratch directory (their `$VSE_CACHE`), and take
    // `.deb`s from the shared download cache.
    let layers = dir.join("vse-cache/layers");
    let build = |out: &str| -> Result<Command> { build_cmd(a, dir, &lock, out) };
    // The first build fills the shared download cache; the timed ones start from it.
    let first = timed("vse build (fills the download cache)", build("first.img")?)?;
    let _ = std::fs::remove_dir_all(dir.join("first.img"));
    let _ = std::fs::remove_dir_all(&layers);
    let full = timed(
        "vse build (warm download cache, no layer)",
        build("full.img")?,
    )?;
    let _ = std::fs::remove_dir_all(dir.join("full.img"));
    let warm = timed(
        "vse build (warm download cache and layer)",
        build("warm.img")?,
    )?;
    let noop = timed("vse build (no-op rebuild)", build("warm.img")?)?;
    let l = Lockfile::read(&lock)?;
    let mut row = Row {
        spec: spec.display().to_string(),
        packages: l.packages.len(),
        download_mib: l.packages.iter().map(|p| p.size).sum::<u64>() as f64 / 1048576.0,
        lock_s: lock_t.as_secs_f64(),
        first_build_s: first.as_secs_f64(),
        full_build_s: full.as_secs_f64(),
        warm_build_s: warm.as_secs_f64(),
        noop_rebuild_s: noop.as_secs_f64(),
        ..Row::default()
    };
    if !a.no_mmdebstrap {
        let mm = mmdebstrap(&l, dir)?;
        row.mmdebstrap_warm_s = Some(mm.as_secs_f64());
        row.speedup_vs_mmdebstrap = Some(mm.as_secs_f64() / warm.as_secs_f64());
        row.mmdebstrap_vs_full = Some(mm.as_secs_f64() / full.as_secs_f64());
    }
    Ok(row)
}

/// `vse build LOCK -o DIR/OUT` with the layers in `DIR/vse-cache` and the shared downloads.
fn build_cmd(a: &BuildBench, dir: &Path, lock: &Path, out: &str) -> Result<Command> {
    let mut c = vse()?;
    c.env("VSE_CACHE", dir.join("vse-cache"))
        .arg("build")
        .arg(lock)
        .arg("-o")
        .arg(dir.join(out))
        .arg("--cache")
        .arg(imgbuild::fetch::DebCache::default_root())
        .arg("--quiet");
    if let Some(agent) = &a.agent {
        c.arg("--agent").arg(agent);
    }
    Ok(c)
}

/// How the last build's root was made (from its manifest).
fn root_of(img: &Path) -> Option<String> {
    use vse_image::manifest::RootSource;
    let m = vse_image::Manifest::read(img)?;
    Some(match m.provenance?.root {
        RootSource::Clean { why } => format!("clean: {why}"),
        RootSource::Layer { .. } => "layer".into(),
        RootSource::Delta { added, removed, .. } => {
            format!("delta +[{}] -[{}]", added.join(" "), removed.join(" "))
        }
    })
}

/// The built image rebuilt with one more package, then with one spec file changed (specs
/// that have no `files:` of their own), against the full build.
fn rebuild_figures(a: &BuildBench, spec: &Path, dir: &Path, row: &mut Row) -> Result<()> {
    let lock = |spec: &Path, out: &Path, add: Option<&str>| -> Result<()> {
        let mut c = vse()?;
        c.arg("lock").arg(spec).arg("-o").arg(out).arg("--quiet");
        if let Some(p) = add {
            c.arg("--add").arg(p);
        }
        for p in &a.policies {
            c.arg("--policy").arg(p);
        }
        if a.allow_expired {
            c.arg("--allow-expired");
        }
        timed("vse lock", c).map(drop)
    };
    let added = dir.join("added.lock");
    lock(spec, &added, Some(&a.add_package))?;
    let t = timed(
        &format!("vse build (the image plus {})", a.add_package),
        build_cmd(a, dir, &added, "warm.img")?,
    )?;
    row.add_one_package_s = Some(t.as_secs_f64());
    row.add_one_package_vs_full = Some(t.as_secs_f64() / row.full_build_s);
    row.add_one_package_root = root_of(&dir.join("warm.img"));
    let text = std::fs::read_to_string(spec)?;
    if text.lines().any(|l| l.starts_with("files:")) {
        return Ok(());
    }
    // The spec with one file: built once, then rebuilt with the file's content changed.
    let mut changed = None;
    for (i, content) in ["one", "two"].iter().enumerate() {
        let s = dir.join("with-file.vse.yaml");
        std::fs::write(
            &s,
            format!("{text}\nfiles:\n  - path: /etc/vse-bench\n    content: \"{content}\\n\"\n"),
        )?;
        let l = dir.join("with-file.lock");
        lock(&s, &l, None)?;
        let t = timed(
            &format!("vse build (spec file, version {})", i + 1),
            build_cmd(a, dir, &l, "warm.img")?,
        )?;
        changed = Some(t);
    }
    let t = changed.expect("two builds");
    row.change_one_file_s = Some(t.as_secs_f64());
    row.change_one_file_vs_full = Some(t.as_secs_f64() / row.full_build_s);
    row.change_one_file_root = root_of(&dir.join("warm.img"));
    Ok(())
}

/// mmdebstrap installing exactly the locked package names from the lock's repositories into
/// a tarball, with its own apt archive cache kept between a warm-up run and the timed run
/// (the documented `sync-in`/`sync-out` recipe).
fn mmdebstrap(l: &Lockfile, dir: &Path) -> Result<Duration> {
    let cache = dir.join("mm-cache");
    std::fs::create_dir_all(&cache)?;
    let suite = l
        .repositories
        .first()
        .map(|r| r.suite.clone())
        .ok_or_else(|| anyhow!("the lock names no repository"))?;
    let include: Vec<String> = l.packages.iter().map(|p| p.name.to_string()).collect();
    let cmd = |out: &Path| {
        let mut c = Command::new("mmdebstrap");
        c.arg("--variant=custom")
            .arg(format!("--include={}", include.join(",")))
            .arg("--skip=essential/unlink")
            .arg("--quiet")
            .arg(format!(
                "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/ && cp -a {}/. \"$1\"/var/cache/apt/archives/",
                cache.display()
            ))
            .arg(format!(
                "--customize-hook=sync-out /var/cache/apt/archives {}",
                cache.display()
            ))
            .arg(&suite)
            .arg(out);
        for r in &l.repositories {
            c.arg(format!(
                "deb {} {} {}",
                r.url,
                r.suite,
                r.components.join(" ")
            ));
        }
        c
    };
    timed(
        "mmdebstrap (fills its cache)",
        cmd(&dir.join("mm-first.tar")),
    )?;
    let _ = std::fs::remove_file(dir.join("mm-first.tar"));
    let t = timed("mmdebstrap (warm cache)", cmd(&dir.join("mm.tar")))?;
    let _ = std::fs::remove_file(dir.join("mm.tar"));
    Ok(t)
}

fn boot_figures(a: &BuildBench, img: &Path, row: &mut Row) -> Result<()> {
    let image = vse_image::ImageDir::open(img)?;
    let plugin = v2m::qemu::QemuPlugin::new(v2m::qemu::QemuConfig {
        run_root: img.with_extension("run"),
        ephemeral: true,
        ..v2m::qemu::QemuConfig::default()
    });
    let spec = vmhost::VmSpec::new(&image, "bench-boot".parse()?, 1, 512);
    let opts = vmhost::BootOptions::new("bench", Duration::from_secs(300));
    // Boot to agent ready; returns the time and the accelerator V2M chose.
    let ready = || -> Result<(Duration, String)> {
        let t = Instant::now();
        let mut vm = vmhost::boot(&plugin, &spec, &opts)?;
        let took = t.elapsed();
        let accel = vm.vm_mut().status()?.accel.unwrap_or_default();
        let _ = vm.stop(Duration::from_secs(10));
        Ok((took, accel))
    };
    // Warm-up boot: the first one pays for the KVM functional check and cold page caches.
    let (_, accel) = ready()?;
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    // Each pair boots at the same time (one TCG vCPU each on a 2-core machine), so both sides
    // see the same background load: sequential runs on a shared machine drift by more than
    // the overhead being measured.
    for _ in 0..a.boot_runs.max(1) {
        eprintln!("bench build: boot to agent ready, next to a plain QEMU boot to init");
        let plain_side = {
            let (image, accel) = (image.clone(), accel.clone());
            std::thread::spawn(move || plain_boot(&image, &accel))
        };
        ours.push(ready()?.0.as_millis() as u64);
        let p = plain_side
            .join()
            .map_err(|_| anyhow!("plain QEMU boot thread panicked"))??;
        plain.push(p.as_millis() as u64);
    }
    let (o, p) = (median(&mut ours), median(&mut plain));
    row.boot_accel = Some(accel);
    row.boot_to_agent_ready_ms = Some(o);
    row.plain_boot_to_init_ms = Some(p);
    row.boot_overhead_pct = Some((o as f64 - p as f64) * 100.0 / p.max(1) as f64);
    Ok(())
}

/// The same kernel, initramfs and root disk on a plain QEMU command line, with
/// `vse.init=/usr/bin/true`: the initramfs mounts the root and hands over to an init that
/// exits at once, the kernel panics with `panic=-1` and `-no-reboot` ends QEMU. The time to
/// QEMU's exit is boot-to-init without any vse machinery.
fn plain_boot(image: &vse_image::ImageDir, accel: &str) -> Result<Duration> {
    let t = Instant::now();
    let st = Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "pc",
            "-accel",
            accel,
            "-nodefaults",
            "-display",
            "none",
        ])
        .args(["-no-reboot", "-m", "512", "-serial", "null"])
        .arg("-kernel")
        .arg(image.kernel())
        .arg("-initrd")
        .arg(image.initrd())
        .arg("-append")
        .arg(format!("{} vse.init=/usr/bin/true", image.cmdline()))
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,snapshot=on",
            image.root().display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("starting qemu-system-x86_64")?;
    let took = t.elapsed();
    if !st.success() {
        bail!("plain QEMU exited with {st}");
    }
    Ok(took)
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn print_row(r: &Row) {
    println!(
        "{}: {} packages ({:.0} MiB); lock {:.1} s; build: first {:.1} s, full (no layer) {:.1} s, warm (layer) {:.1} s, no-op rebuild {:.3} s",
        r.spec,
        r.packages,
        r.download_mib,
        r.lock_s,
        r.first_build_s,
        r.full_build_s,
        r.warm_build_s,
        r.noop_rebuild_s
    );
    if let (Some(mm), Some(x), Some(xf)) = (
        r.mmdebstrap_warm_s,
        r.speedup_vs_mmdebstrap,
        r.mmdebstrap_vs_full,
    ) {
        println!(
            "  mmdebstrap (same set, warm cache, tarball): {mm:.1} s → vse is {x:.2}x faster warm, {xf:.2}x without a layer"
        );
    }
    if let Some(t) = r.launch_spec_cache_hit_s {
        println!("  vse launch SPEC, unchanged spec (image store hit): {t:.3} s before the launch");
    }
    if let (Some(t), Some(x)) = (r.add_one_package_s, r.add_one_package_vs_full) {
        println!(
            "  add one package: {t:.1} s = {:.0}% of the full build ({})",
            x * 100.0,
            r.add_one_package_root.as_deref().unwrap_or("?")
        );
    }
    if let (Some(t), Some(x)) = (r.change_one_file_s, r.change_one_file_vs_full) {
        println!(
            "  change one file: {t:.1} s = {:.0}% of the full build ({})",
            x * 100.0,
            r.change_one_file_root.as_deref().unwrap_or("?")
        );
    }
    if let (Some(acc), Some(o), Some(p), Some(pct)) = (
        &r.boot_accel,
        r.boot_to_agent_ready_ms,
        r.plain_boot_to_init_ms,
        r.boot_overhead_pct,
    ) {
        println!(
            "  boot ({acc}): vse to agent ready {o} ms, plain QEMU to init {p} ms → overhead {pct:+.1}%"
        );
    }
}
