//! `vse build SPEC|LOCK`: a lockfile in, a bootable image directory out (manifest.json,
//! kernel, initrd, ext4 root, optionally qcow2 or tar.gz). Given a spec, it is resolved first
//! and the lock written next to the image (`<output>.lock`), as `vse lock` would. The work is
//! `imgbuild::pipeline`'s; this draws progress and prints the result.

use super::envload::shown;
use crate::exit::Failure;
use anyhow::Result;
use clap::{Args, ValueEnum};
use imgbuild::pipeline::{BuildRequest, ImageStore, Report};
use imgbuild::progress::{Event, Progress, Silent};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use vsec::env::EffectiveEnv;

pub(crate) use imgbuild::pipeline::is_spec;

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
    /// Accept Release files past their Valid-Until (when locking a spec, and when verifying
    /// the lock against the repositories before building).
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
    /// Package cache root (its `debs/`); default: the cache root (`VSE_CACHE`, see `vse --help`).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Ignore the spec named in the lock: packages only.
    #[arg(long)]
    pub packages_only: bool,
    /// Unpack and configure every package, and keep no configured root (layer) for later
    /// builds. A build as an ordinary user never keeps layers.
    #[arg(long)]
    pub no_layers: bool,
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(mut a: BuildArgs) -> Result<ExitCode> {
    let quiet = a.quiet || a.json;
    let audit = super::audit::auditor(if is_spec(&a.input) { &a.policies } else { &[] })?;
    let entry = vse_audit::Entry::allowed(vse_audit::Action::Build).detail(format!(
        "{} -> {}",
        a.input.display(),
        a.output.display()
    ));
    super::audit::record(&audit, entry.clone(), locked(&mut a, quiet))?;
    let req = BuildRequest {
        qcow2: a.format == Format::Qcow2,
        tar: a.format == Format::Tar,
        cache: a.cache.clone(),
        packages_only: a.packages_only,
        allow_expired: a.allow_expired,
        no_layers: a.no_layers,
        ..BuildRequest::new(
            a.input.clone(),
            a.output.clone(),
            crate::guest_agent::choose(a.agent.clone()),
        )
    };
    let built = with_report(quiet, |r| imgbuild::pipeline::build_lock(&req, r))
        .map_err(shown)
        .map_err(|e| super::audit::late_refusal(&audit, entry, e))?;
    let (outcome, customized_from) = (built.outcome, built.customized_from);
    let m = &outcome.manifest;
    if a.json {
        let v = serde_json::json!({
            "dir": outcome.dir,
            "cache_hit": outcome.cache_hit,
            "layer_note": outcome.layer_note,
            "root": outcome.root,
            "phases": outcome.phases,
            "customized_from": customized_from,
            "manifest": m,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_outcome(&outcome, customized_from.as_deref());
    }
    Ok(ExitCode::SUCCESS)
}

/// The helper of a rootless build: its parent is `vse build` of this user, its stdin and
/// stdout their protocol (see `imgbuild::rootless`).
pub fn in_userns() -> ExitCode {
    let code = imgbuild::rootless::child_main(Some(crate::guest_agent::EMBEDDED));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Builds the lock `a.input` names (`vse build LOCK`), a spec's made first: the policies'
/// rules are checked here, so this is the build's admission.
fn locked(a: &mut BuildArgs, quiet: bool) -> Result<()> {
    if is_spec(&a.input) {
        a.policies = super::site::stacked(&a.policies)?;
        let out = a.output.with_extension("lock");
        let lock = with_report(quiet, |r| {
            imgbuild::pipeline::lock_spec(&a.input, &a.policies, &out, a.allow_expired, r)
        })
        .map_err(shown)?;
        if !quiet {
            eprintln!(
                "vse build: locked {} packages → {}",
                lock.packages.len(),
                out.display()
            );
        }
        a.input = out;
    } else if !a.policies.is_empty() {
        return Err(Failure::invalid(format!(
            "--policy applies to a spec, but {} is a lockfile (it names its own policies); \
             hint: pass the spec instead, or drop --policy",
            a.input.display()
        ))
        .into());
    } else {
        super::site::lock_covers_site(&a.input)?;
    }
    Ok(())
}

fn print_outcome(outcome: &imgbuild::build::BuildOutcome, customized_from: Option<&Path>) {
    let m = &outcome.manifest;
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
    match customized_from {
        Some(s) => println!("  customized {} ({})", s.display(), m.customization_hash),
        None => println!("  customized no (packages only)"),
    }
    println!("  packages   {}", m.packages);
    if let Some(r) = &outcome.root {
        println!("  root       {}", root_source(r));
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

/// The image of a spec under its policies (`env`: their merge), for `vse launch SPEC`,
/// `vse spank` and `vse bench build`: from the image store, built there when missing.
pub fn image_for_spec(
    spec: &Path,
    policies: &[PathBuf],
    env: &EffectiveEnv,
    quiet: bool,
) -> Result<PathBuf> {
    let agent = crate::guest_agent::choose(None);
    let outcome = with_report(quiet, |r| {
        ImageStore::default().image_for_spec(spec, policies, env, agent, r)
    })
    .map_err(shown)?;
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

fn root_source(r: &imgbuild::layers::base::RootSource) -> String {
    use imgbuild::layers::base::RootSource;
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

/// Runs `f` with nothing shown (`quiet`) or with `vse build`'s progress on stderr.
pub(crate) fn with_report<T>(quiet: bool, f: impl FnOnce(&dyn Report) -> T) -> T {
    if quiet {
        return f(&Silent);
    }
    let r = CliReport::default();
    let out = f(&r);
    r.finish();
    out
}

/// A spinner while resolving (on a terminal only), then the build's progress.
#[derive(Default)]
struct CliReport {
    spinner: Mutex<Option<ProgressBar>>,
    build: OnceLock<CliProgress>,
}

impl CliReport {
    fn finish(&self) {
        if let Some(p) = self.build.get() {
            p.finish();
        }
    }
}

impl Report for CliReport {
    fn resolving(&self, active: bool) {
        let mut s = self.spinner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pb) = s.take() {
            pb.finish_and_clear();
        }
        if active && std::io::stderr().is_terminal() {
            let pb = ProgressBar::new_spinner();
            if let Ok(st) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
                pb.set_style(st);
            }
            pb.enable_steady_tick(Duration::from_millis(120));
            pb.set_message("verifying the repositories and resolving");
            *s = Some(pb);
        }
    }

    fn build(&self) -> &dyn Progress {
        self.build.get_or_init(CliProgress::new)
    }
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
            b.enable_steady_tick(Duration::from_millis(120));
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
