//! `vse import SOURCE -o IMAGE`: an OCI/Docker image or rootfs tarball made into a VSE image
//! (same layout and manifest as `vse build`), with a kernel from `--kernel-from` or resolved
//! like `vse lock` does, checked against `--policy` when given.

use crate::exit::Failure;
use anyhow::Result;
use clap::Args;
use imgbuild::import::{ImportOptions, Source, import, kernel_plan};
use imgbuild::progress::Silent;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
#[command(
    after_help = "Sources: oci-archive:FILE[:TAG], oci:DIR[:TAG], docker-archive:FILE[:REPO:TAG],
tar:ROOTFS.tar[.gz|.zst|.xz]. Every blob is checked against its digest; layers are unpacked with
the whiteout rules and no path may leave the image root.

Examples:
  vse import oci-archive:debian.oci.tar -o debian.img
  vse import docker-archive:app.tar:example/app:1.0 --kernel-from minimal.lock -o app.img
  vse import tar:rootfs.tar.gz --policy specs/site.policy.yaml -o rootfs.img --json"
)]
pub struct ImportArgs {
    /// The image to import (KIND:PATH[:REF]).
    pub source: String,
    /// Output directory (replaced atomically once the image is complete).
    #[arg(short, long, default_value = "image")]
    pub output: PathBuf,
    /// Kernel and initramfs from this lockfile or spec; default: the Debian cloud kernel of
    /// the host's suite, resolved against its apt sources under the policies.
    #[arg(long, value_name = "LOCK|SPEC")]
    pub kernel_from: Option<PathBuf>,
    /// An admin policy the image must satisfy; repeat to stack (site first, then partition).
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<PathBuf>,
    /// Accept Release files past their Valid-Until when resolving the kernel.
    #[arg(long)]
    pub allow_expired: bool,
    /// Static guest agent to bake in instead of the one built into vse.
    #[arg(long, env = "VSE_GUEST_AGENT")]
    pub agent: Option<PathBuf>,
    /// Download cache for the kernel packages.
    #[arg(long)]
    pub cache: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(mut a: ImportArgs) -> Result<ExitCode> {
    a.policies = super::site::stacked(&a.policies)?;
    let bad = |e: &dyn std::fmt::Display| Failure::invalid(e.to_string());
    let src = Source::parse(&a.source).map_err(|e| bad(&e))?;
    let mut policies = Vec::new();
    for p in &a.policies {
        policies.push(vsec::policy::load(p).map_err(|e| bad(&e))?);
    }
    let (stack, problems) = vsec::merge::stack(&policies);
    let refused = vsec::merge::images::check_import_allowed(&stack, &src.given);
    let audit = super::audit::auditor(&a.policies)?;
    let entry = vse_audit::Entry::allowed(vse_audit::Action::Import).detail(format!(
        "{} -> {}",
        a.source,
        a.output.display()
    ));
    let checked = match [problems, refused].into_iter().find(|d| !d.is_empty()) {
        Some(d) => Err(bad(&format!("{d}\nhint: `vse check` explains each policy rule")).into()),
        None => Ok(()),
    };
    super::audit::record(&audit, entry, checked)?;
    let quiet = a.quiet || a.json;
    let lock = super::build::with_report(quiet, |r| {
        imgbuild::pipeline::lock_kernel(a.kernel_from.as_deref(), &a.policies, a.allow_expired, r)
    })
    .map_err(super::envload::shown)?;
    let plan = kernel_plan(&lock).map_err(|e| bad(&e))?;
    let mut opts = ImportOptions::new(a.output.clone(), crate::guest_agent::choose(a.agent));
    opts.arch = lock.lock.architecture.to_string();
    opts.cache_root = a.cache.unwrap_or(opts.cache_root);
    opts.source_date_epoch = std::env::var("SOURCE_DATE_EPOCH").ok();
    opts.policy = (!a.policies.is_empty()).then_some(stack);
    opts.policies = imgbuild::pipeline::policy_refs(&a.policies).map_err(super::envload::shown)?;
    let outcome = if quiet {
        import(&src, &plan, &opts, &Silent)
    } else {
        let p = super::build::CliProgress::for_command("vse import");
        let r = import(&src, &plan, &opts, &p);
        p.finish();
        r
    };
    let outcome = outcome.map_err(|e| {
        if e.is_bad_input() {
            anyhow::Error::new(bad(&e))
        } else {
            anyhow::Error::new(e).context(format!("importing {}", a.source))
        }
    })?;
    let m = &outcome.manifest;
    if a.json {
        let v = serde_json::json!({"dir": outcome.dir, "manifest": m});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if let Some(i) = &m.imported {
        println!(
            "image {} (imported from {})",
            outcome.dir.display(),
            i.source
        );
        println!(
            "  source     {} ({} layers)",
            i.source_digest,
            i.layers.len()
        );
        println!(
            "  packages   {} (dpkg database: {})",
            m.packages, i.dpkg_database
        );
        println!("  kernel     {}", m.kernel_version);
        for (name, p) in &m.parts {
            println!(
                "  {name:<10} {} {} bytes sha256:{}",
                p.file, p.size, p.sha256
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
