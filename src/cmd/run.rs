//! `vse run IMAGE -- CMD ARGS`: boot an image built by `vse build` with the V2M QEMU plugin,
//! run one command through the guest agent, print its output and exit with its status.
//!
//! The image is never modified: the VM writes to a throw-away qcow2 overlay. QEMU is owned by
//! a handle whose Drop kills it, and `die_with_parent` covers a killed `vse`, so no path
//! (error, panic, signal) leaves a VM behind.

use crate::exit::Failure;
use anyhow::{Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use vmhost::{BootOptions, CONSOLE_LINES, RunningVm, VmSpec};
use vse_guest_agent::ExecOutput;
use vse_guest_agent::protocol::{GuestUser, OutStream};
use vse_image::ImageDir;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Image directory written by `vse build` (holds manifest.json).
    pub image: PathBuf,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 1)]
    pub vcpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory: u64,
    /// Accelerator: auto = KVM only if a functional boot check passes, else TCG.
    #[arg(long, default_value = "auto", value_parser = parse_accel)]
    pub accel: AccelPolicy,
    /// Longest wait for the guest agent to report ready, seconds.
    #[arg(long, default_value_t = 300)]
    pub boot_timeout: u64,
    /// Parent of the per-VM run directory (also caches the KVM check's verdict). Default:
    /// root's /run/vse/v2m, a user's $XDG_RUNTIME_DIR/vse or /tmp/vse-run-UID.
    #[arg(long, env = "VSE_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// Print one JSON object (status, stdout, stderr, accelerator) instead of the raw output.
    #[arg(long)]
    pub json: bool,
    /// Also say how the accelerator was chosen.
    #[arg(short, long)]
    pub verbose: bool,
    /// Run the command as the guest's root instead of as you (needs a site policy granting
    /// `users.allow_root`).
    #[arg(long)]
    pub guest_root: bool,
    /// Share a host directory with the VM (repeatable): HOST[:GUEST][:ro]. GUEST defaults to
    /// HOST; the site's `shares.*` policy bounds what may be shared.
    #[arg(long = "share", value_name = "HOST[:GUEST][:ro]")]
    pub shares: Vec<String>,
    /// Leave out the shares every job gets by default (the working directory, unless the
    /// site's `shares.default` says otherwise).
    #[arg(long)]
    pub no_default_shares: bool,
    /// The command to run in the guest, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<String>,
}

fn parse_accel(s: &str) -> Result<AccelPolicy, String> {
    match s {
        "auto" => Ok(AccelPolicy::Auto),
        "kvm" => Ok(AccelPolicy::Kvm),
        "tcg" => Ok(AccelPolicy::Tcg),
        _ => Err(format!(
            "unknown accelerator {s:?}: expected auto, kvm or tcg"
        )),
    }
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    if a.vcpus == 0 || a.memory < 128 {
        return Err(Failure::invalid(format!(
            "--vcpus {} --memory {}: expected at least 1 vCPU and 128 MiB",
            a.vcpus, a.memory
        ))
        .into());
    }
    let shares = (a.shares.as_slice(), !a.no_default_shares);
    let checked = super::site::run_rules(&a.image, a.vcpus, a.memory, a.guest_root, shares);
    let mut entry = vse_audit::Entry::allowed(vse_audit::Action::Launch)
        .detail(format!("vse run -- {}", a.cmd.join(" ")));
    if let Ok((dir, _)) = &checked {
        entry.image = vse_audit::image_digest(dir);
    }
    let (boot_dir, shares) = super::audit::record(&super::audit::auditor(&[])?, entry, checked)?;
    let image = ImageDir::open(&boot_dir).map_err(|e| Failure::invalid(e.to_string()))?;
    let run_dir = a.run_dir.clone().unwrap_or_else(vse_base::run_root);
    let cfg = QemuConfig {
        binary: a.qemu.clone(),
        run_root: run_dir.clone(),
        accel: a.accel,
        die_with_parent: true,
        ephemeral: true,
        ..QemuConfig::default()
    };
    // The same choice (and cached verdict) the plugin makes when it starts the VM.
    let accel = v2m::qemu::accel::choose(a.accel, &cfg.resolve_binary()?, image.kernel(), &run_dir);
    if !a.json {
        if let Some(n) = accel.notice() {
            eprintln!("vse run: {n}");
        }
        if a.verbose {
            eprintln!(
                "vse run: accelerator {}: {}",
                accel.accel.as_str(),
                accel.detail
            );
        }
    }
    let name = format!("run-{}", std::process::id()).parse()?;
    let spec = VmSpec::new(&image, name, a.vcpus, a.memory);
    let mut opts = BootOptions::new("run", Duration::from_secs(a.boot_timeout));
    opts.agent = opts.agent.shares(super::shares::serve(&shares)?);
    let mut vm = vmhost::boot(&QemuPlugin::new(cfg), &spec, &opts)?;
    let user = if a.guest_root {
        GuestUser::root()
    } else {
        GuestUser::current()
    };
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| super::shares::guest_cwd(&shares, &d));
    let out = vm
        .link()
        .mount_shares(Duration::from_secs(60))
        .context("sharing the job's directories")
        .and_then(|()| exec_in_guest(&vm, &a.cmd, user, cwd, !a.json))
        .map_err(|e| {
            e.context(format!(
                "guest console (last lines):\n{}",
                vm.console_tail(CONSOLE_LINES)
            ))
        });
    let stop = vm.stop(Duration::from_secs(10));
    let out = out?;
    stop.context("stopping the VM")?;

    if a.json {
        let v = serde_json::json!({
            "image": a.image,
            "accelerator": accel.accel.as_str(),
            "accelerator_reason": accel.reason,
            "accelerator_detail": accel.detail,
            "kernel": vm.link().kernel(),
            "argv": a.cmd,
            "status": out.status,
            "stdout": out.stdout,
            "stderr": out.stderr,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    // A status outside 0..=255 (an agent-side failure to run) is an internal error.
    Ok(ExitCode::from(u8::try_from(out.status).unwrap_or(1)))
}

/// Runs `argv`, then asks the agent to power off. With `live`, the output goes to this
/// process's stdout/stderr as the guest writes it (and is not collected).
fn exec_in_guest(
    vm: &RunningVm,
    argv: &[String],
    user: GuestUser,
    cwd: Option<String>,
    live: bool,
) -> Result<ExecOutput> {
    use std::io::Write;
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let status = vm
        .link()
        .run_with_input(
            &args,
            BTreeMap::new(),
            user,
            cwd,
            std::io::stdin(),
            &mut |s, d| match (s, live) {
                (OutStream::Stdout, true) => {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(d.as_bytes()).and_then(|_| o.flush());
                }
                (OutStream::Stderr, true) => {
                    let _ = std::io::stderr().write_all(d.as_bytes());
                }
                (OutStream::Stdout, false) => stdout.push_str(d),
                (OutStream::Stderr, false) => stderr.push_str(d),
            },
        )
        .with_context(|| format!("running {argv:?} in the guest"))?;
    // Best effort: the forced stop afterwards covers an agent that does not answer.
    let _ = vm.link().shutdown(Duration::from_secs(10));
    Ok(ExecOutput {
        status,
        stdout,
        stderr,
    })
}
