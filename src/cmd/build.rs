//! `vse build SPEC|LOCK`: a lockfile in, a bootable image directory out (manifest.json,
//! kernel, initrd, ext4 root, optionally qcow2 or tar.gz). Given a spec, it is resolved first
//! and the lock written next to the image (`<output>.lock`), as `vse lock` would. When the lock
//! names its spec, the spec and its policies are loaded again to apply files, users, groups,
//! environment and post-install commands on top of the locked packages.

use super::envload::relative_to;
use crate::exit::Failure;
use anyhow::{Context, Result, anyhow};
use clap::{Args, ValueEnum};
use imgbuild::build::{BuildOptions, build};
use imgbuild::customize::{Customization, FileEntry, UserEntry};
use imgbuild::progress::{Event, Progress, Silent};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vsec::env::{EffectiveEnv, FileContent, Origin};
use vsec::lock::{Lockfile, SourceFiles};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// ext4 root disk only (always written).
    Raw,
    /// Also a qcow2 copy of the root disk.
    Qcow2,
    /// Also a tar.gz of the root file system.
    Tar,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vse build specs/minimal.vse.yaml --policy specs/site.policy.yaml -o minimal.img
  vse lock specs/minimal.vse.yaml -o minimal.lock && vse build minimal.lock -o minimal.img
  vse build minimal.lock -o minimal.img --format qcow2 --json")]
pub struct BuildArgs {
    /// A spec (`*.vse.yaml`: resolved first) or a lockfile written by `vse lock`.
    pub input: PathBuf,
    /// With a spec: an admin policy; repeat to stack (site first, then partition).
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<PathBuf>,
    /// With a spec: accept Release files past their Valid-Until.
    #[arg(long)]
    pub allow_expired: bool,
    /// Output directory (replaced atomically; an unchanged lock is a cache hit).
    #[arg(short, long, default_value = "image")]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Raw)]
    pub format: Format,
    /// Static guest agent to bake in instead of the one built into vse.
    #[arg(long, env = "VSE_GUEST_AGENT")]
    pub agent: Option<PathBuf>,
    /// Download cache (defaults to imgbuild's per-user cache).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Ignore the spec named in the lock: packages only.
    #[arg(long)]
    pub packages_only: bool,
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(mut a: BuildArgs) -> Result<ExitCode> {
    if is_spec(&a.input) {
        a.input = lock_spec(&a)?;
    } else if !a.policies.is_empty() {
        return Err(Failure::invalid(format!(
            "--policy applies to a spec, but {} is a lockfile (it names its own policies); \
             hint: pass the spec instead, or drop --policy",
            a.input.display()
        ))
        .into());
    }
    let (outcome, customized_from) = build_lock(&a)?;

    let m = &outcome.manifest;
    if a.json {
        let v = serde_json::json!({
            "dir": outcome.dir,
            "cache_hit": outcome.cache_hit,
            "layer_note": outcome.layer_note,
            "customized_from": customized_from,
            "manifest": m,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "image {}{}",
            outcome.dir.display(),
            if outcome.cache_hit {
                " (cache hit: unchanged)"
            } else {
                ""
            }
        );
        println!("  lock       {}", m.lock_hash);
        match &customized_from {
            Some(s) => println!("  customized {} ({})", s.display(), m.customization_hash),
            None => println!("  customized no (packages only)"),
        }
        println!("  packages   {}", m.packages);
        if let Some(p) = &m.provenance {
            println!("  root       {}", root_source(&p.root));
        }
        if let Some(n) = &outcome.layer_note {
            println!("  note       layers not kept: {n}");
        }
        println!("  kernel     {}", m.kernel_version);
        println!("  cmdline    {}", m.kernel_cmdline);
        for (name, p) in &m.parts {
            println!(
                "  {name:<10} {} {} bytes sha256:{}",
                p.file, p.size, p.sha256
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the image of the lockfile `a.input` (customized from the spec it names, unless
/// `--packages-only`); returns the outcome and the spec it was customized from.
fn build_lock(a: &BuildArgs) -> Result<(imgbuild::build::BuildOutcome, Option<PathBuf>)> {
    let bytes = std::fs::read(&a.input).map_err(|e| {
        Failure::invalid(format!("cannot read lockfile {}: {e}", a.input.display()))
    })?;
    let text = String::from_utf8(bytes.clone())
        .map_err(|_| Failure::invalid(format!("{}: lockfile is not UTF-8", a.input.display())))?;
    let lock = Lockfile::from_toml(&a.input, &text)?;
    let sde = std::env::var("SOURCE_DATE_EPOCH").ok();
    let plan = imgbuild::from_lock::plan_from_lock(&lock, &bytes, sde.as_deref())
        .map_err(|e| Failure::reword(&e, format!("{}: {e}", a.input.display())))?;

    let (customization, customized_from) =
        if a.packages_only || lock.source.spec.as_os_str().is_empty() {
            (Customization::default(), None)
        } else {
            let base = a.input.parent().unwrap_or(Path::new("."));
            let env = load_env(base, &lock)?;
            (
                to_customization(&env, base)?,
                Some(base.join(&lock.source.spec)),
            )
        };

    let mut opts = BuildOptions::new(
        a.output.clone(),
        crate::guest_agent::choose(a.agent.clone()),
    );
    if let Some(c) = &a.cache {
        opts.cache_root = c.clone();
    }
    opts.qcow2 = a.format == Format::Qcow2;
    opts.tar = a.format == Format::Tar;
    opts.customization = customization;

    let outcome = if a.quiet || a.json {
        build(&plan, &opts, &Silent)
    } else {
        let p = CliProgress::new();
        let r = build(&plan, &opts, &p);
        p.finish();
        r
    }
    .with_context(|| format!("building {} from {}", a.output.display(), a.input.display()))?;
    Ok((outcome, customized_from))
}

/// The image of a spec under its policies (`env`: their merge), for `vse launch SPEC`:
/// resolved now, then found in (or built into) the image store, `$VSE_CACHE/images/<key>`,
/// where the key is the lock's content (packages, repositories and the effective
/// environment's hash). An unchanged spec, policies and repositories find the image built
/// last time.
pub fn image_for_spec(
    spec: &Path,
    policies: &[PathBuf],
    env: &EffectiveEnv,
    quiet: bool,
) -> Result<PathBuf> {
    let store = imgbuild::fetch::DebCache::default_root().join("images");
    let la = super::lock::LockArgs {
        spec: spec.to_path_buf(),
        policies: policies.to_vec(),
        add: vec![],
        output: store.join("vse.lock"),
        check: false,
        allow_expired: false,
        json: false,
        quiet,
    };
    let mut lock = super::lock::resolve(env, &la, &[])?.lock;
    lock.source = Default::default();
    let key = imgbuild::fetch::sha256_hex(lock.to_toml().as_bytes());
    let dir = store.join(&key[..32]);
    lock.source = SourceFiles {
        spec: relative_to(spec, &dir),
        policies: policies.iter().map(|p| relative_to(p, &dir)).collect(),
    };
    let lock_path = dir.join("vse.lock");
    std::fs::create_dir_all(&dir).with_context(|| {
        format!(
            "creating {}; hint: set VSE_CACHE to a writable directory",
            dir.display()
        )
    })?;
    lock.write(&lock_path)
        .with_context(|| format!("writing {}", lock_path.display()))?;
    let (outcome, _) = build_lock(&BuildArgs {
        input: lock_path,
        policies: vec![],
        allow_expired: false,
        output: dir.join("image"),
        format: Format::Raw,
        agent: None,
        cache: None,
        packages_only: false,
        json: false,
        quiet,
    })?;
    if !quiet {
        eprintln!(
            "vse: image of {} {}",
            spec.display(),
            if outcome.cache_hit {
                "unchanged (cache hit)"
            } else {
                "built"
            }
        );
    }
    Ok(outcome.dir)
}

fn root_source(r: &vse_image::manifest::RootSource) -> String {
    use vse_image::manifest::RootSource;
    match r {
        RootSource::Clean { why } => format!("unpacked and configured clean ({why})"),
        RootSource::Layer { layer } => format!("configured root reused (layer {layer})"),
        RootSource::Delta {
            from_layer,
            added,
            removed,
        } => format!(
            "layer {from_layer} + [{}] - [{}] (no maintainer script involved)",
            added.join(" "),
            removed.join(" ")
        ),
    }
}

/// A spec is YAML; a lock is TOML starting with `format = …`.
pub(crate) fn is_spec(p: &Path) -> bool {
    match p.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml") => true,
        Some("lock" | "toml") => false,
        _ => std::fs::read_to_string(p)
            .map(|t| !t.trim_start().starts_with("format"))
            .unwrap_or(false),
    }
}

/// Resolves the spec into `<output>.lock` (atomically, like `vse lock`) and returns its path.
fn lock_spec(a: &BuildArgs) -> Result<PathBuf> {
    let env = super::envload::load_env(&a.input, &a.policies)?;
    let out = a.output.with_extension("lock");
    let la = super::lock::LockArgs {
        spec: a.input.clone(),
        policies: a.policies.clone(),
        add: vec![],
        output: out.clone(),
        check: false,
        allow_expired: a.allow_expired,
        json: a.json,
        quiet: a.quiet,
    };
    let lock = super::lock::resolve(&env, &la, &[])?.lock;
    lock.write(&out)
        .with_context(|| format!("writing {}", out.display()))?;
    if !a.quiet && !a.json {
        eprintln!(
            "vse build: locked {} packages → {}",
            lock.packages.len(),
            out.display()
        );
    }
    Ok(out)
}

/// Spec + policies named by the lock (paths relative to the lock's directory), merged.
fn load_env(base: &Path, lock: &Lockfile) -> Result<EffectiveEnv> {
    let spec_path = base.join(&lock.source.spec);
    let spec = vsec::spec::load(&spec_path).map_err(|e| {
        Failure::reword(
            &e,
            format!(
                "spec {} named by the lock: {e}; hint: pass --packages-only to build without it",
                spec_path.display()
            ),
        )
    })?;
    let policies = lock
        .source
        .policies
        .iter()
        .map(|p| {
            let path = base.join(p);
            vsec::policy::load(&path).map_err(|e| {
                Failure::reword(
                    &e,
                    format!("policy {} named by the lock: {e}", path.display()),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let env = vsec::merge::merge(&spec, &policies)?;
    if env.env_hash() != lock.env_hash {
        return Err(Failure::invalid(format!(
            "{} or its policies changed since the lock was made (env hash {} ≠ lock's {}); hint: re-run `vse lock`",
            spec_path.display(),
            env.env_hash(),
            lock.env_hash
        ))
        .into());
    }
    Ok(env)
}

fn to_customization(env: &EffectiveEnv, base: &Path) -> Result<Customization> {
    let uid_of = |name: &str| -> Option<u32> {
        if name == "root" {
            return Some(0);
        }
        env.users
            .iter()
            .find(|u| u.value.name.as_str() == name)
            .map(|u| u.value.uid)
    };
    let gid_of = |name: &str| -> Option<u32> {
        if name == "root" {
            return Some(0);
        }
        env.groups
            .iter()
            .find(|g| g.value.name.as_str() == name)
            .map(|g| g.value.gid)
    };
    let mut c = Customization::default();
    for f in &env.files {
        let v = &f.value;
        let content = match &v.content {
            FileContent::Inline(s) => s.clone().into_bytes(),
            FileContent::Source(p) => {
                let p = if p.is_absolute() {
                    p.clone()
                } else {
                    base.join(p)
                };
                std::fs::read(&p).map_err(|e| {
                    Failure::invalid(format!(
                        "file {} ({}): cannot read source {}: {e}",
                        v.path,
                        f.from,
                        p.display()
                    ))
                })?
            }
        };
        let unknown = |what: &str, n: &str| {
            anyhow!(Failure::invalid(format!(
                "file {} ({}): {what} {n:?} is neither root nor declared in the spec's users/groups",
                v.path, f.from
            )))
        };
        let entry = FileEntry {
            path: v.path.as_str().to_string(),
            content,
            mode: v.mode.bits(),
            uid: uid_of(v.owner.as_str()).ok_or_else(|| unknown("owner", v.owner.as_str()))?,
            gid: gid_of(v.group.as_str()).ok_or_else(|| unknown("group", v.group.as_str()))?,
        };
        match f.from {
            Origin::Policy { .. } => c.required_files.push(entry),
            _ => c.files.push(entry),
        }
    }
    c.groups = env
        .groups
        .iter()
        .map(|g| g.value.name.as_str().to_string())
        .collect();
    c.users = env
        .users
        .iter()
        .map(|u| UserEntry {
            name: u.value.name.as_str().to_string(),
            uid: Some(u.value.uid),
            groups: u
                .value
                .groups
                .iter()
                .map(|g| g.as_str().to_string())
                .collect(),
        })
        .collect();
    c.env = env
        .environment
        .iter()
        .map(|e| (e.value.name.clone(), e.value.value.clone()))
        .collect();
    c.post_install = env.post_install.iter().map(|s| s.value.clone()).collect();
    Ok(c)
}

/// indicatif on a terminal, one line per step otherwise (CI logs).
pub(crate) struct CliProgress {
    bar: Option<ProgressBar>,
    /// Prefix of the plain lines (`vse build`).
    cmd: &'static str,
}

impl CliProgress {
    fn new() -> Self {
        Self::for_command("vse build")
    }
    pub(crate) fn for_command(cmd: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            b
        });
        CliProgress { bar, cmd }
    }
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Progress for CliProgress {
    fn event(&self, ev: Event) {
        match (&self.bar, ev) {
            (Some(b), Event::Phase(p)) => {
                b.set_style(ProgressStyle::default_spinner());
                b.set_message(p.label());
            }
            (None, Event::Phase(p)) => eprintln!("{}: {}", self.cmd, p.label()),
            (Some(b), Event::FetchStart { files, bytes }) => {
                b.set_length(bytes);
                b.set_position(0);
                if let Ok(s) = ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                ) {
                    b.set_style(s.progress_chars("=> "));
                }
                b.set_message(format!("fetching {files} packages"));
            }
            (None, Event::FetchStart { files, bytes }) => {
                eprintln!("{}: {files} packages, {} MiB", self.cmd, bytes >> 20)
            }
            (Some(b), Event::FetchFile { bytes, .. }) => b.inc(bytes),
            (Some(b), Event::ScriptOutput(line)) => b.println(line),
            (None, Event::ScriptOutput(line)) => eprintln!("  {line}"),
            (Some(b), Event::Unpacked { name }) if name.starts_with("layer ") => {
                b.set_message(format!("unpacked {name}"))
            }
            (None, Event::Unpacked { name }) if name.starts_with("layer ") => {
                eprintln!("{}: unpacked {name}", self.cmd)
            }
            _ => {}
        }
    }
}
