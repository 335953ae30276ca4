//! `vse run IMAGE -- CMD ARGS`: boot an image built by `vse build` with the V2M QEMU plugin,
//! run one command through the guest agent, print its output and exit with its status.
//!
//! The image is never modified: the VM writes to a throw-away qcow2 overlay. QEMU is owned by
//! a `QemuVm` handle whose Drop kills it, and `die_with_parent` covers a killed `vse`, so no
//! path (error, panic, signal) leaves a VM behind.

use crate::exit::Failure;
use anyhow::{Context, Result, anyhow};
use clap::Args;
use imgbuild::manifest::Manifest;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use v2m::overlay::{OverlayRequest, create_overlays};
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin, find_binary};
use v2m::{Disk, DiskFormat, ImageRef, Profile, Vm, VmName};

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
    /// Parent of the per-VM run directory (also caches the KVM check's verdict).
    #[arg(long, env = "VSE_RUN_DIR", default_value = "/run/vse/v2m")]
    pub run_dir: PathBuf,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// Print one JSON object (status, stdout, stderr, accelerator) instead of the raw output.
    #[arg(long)]
    pub json: bool,
    /// Also say how the accelerator was chosen.
    #[arg(short, long)]
    pub verbose: bool,
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

pub(crate) fn load_manifest(dir: &Path) -> Result<Manifest> {
    let m = Manifest::read(dir).ok_or_else(|| {
        Failure::invalid(format!(
            "{}: no readable manifest.json; expected an image directory written by `vse build`",
            dir.display()
        ))
    })?;
    if !m.parts_present(dir) {
        return Err(Failure::invalid(format!(
            "{}: image is incomplete (a part is missing or has the wrong size); hint: rebuild it with `vse build`",
            dir.display()
        ))
        .into());
    }
    Ok(m)
}

fn part(m: &Manifest, dir: &Path, name: &str) -> Result<PathBuf> {
    let p = m.part_path(dir, name).ok_or_else(|| {
        Failure::invalid(format!("{}: manifest has no {name} part", dir.display()))
    })?;
    std::path::absolute(&p).with_context(|| format!("resolving {}", p.display()))
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    if a.vcpus == 0 || a.memory < 128 {
        return Err(Failure::invalid(format!(
            "--vcpus {} --memory {}: expected at least 1 vCPU and 128 MiB",
            a.vcpus, a.memory
        ))
        .into());
    }
    let m = load_manifest(&a.image)?;
    let mut booted = boot(
        &m, &a.image, a.vcpus, a.memory, a.accel, &a.run_dir, &a.qemu,
    )?;
    let accel = booted.accel.clone();
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

    let vm = &booted.vm;
    let live = !a.json;
    let out = exec_in_guest(vm, &a.cmd, Duration::from_secs(a.boot_timeout), live).map_err(|e| {
        let log = vm.console_log().unwrap_or_default();
        let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(2000)..]).into_owned();
        e.context(format!("guest console (last lines):\n{tail}"))
    });
    let stop = booted.vm.stop(Duration::from_secs(10));
    let (kernel, out) = out?;
    stop.context("stopping the VM")?;

    if a.json {
        let v = serde_json::json!({
            "image": a.image,
            "accelerator": accel.accel.as_str(),
            "accelerator_reason": accel.reason,
            "accelerator_detail": accel.detail,
            "kernel": kernel,
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

/// A started VM of an image: QEMU dies with the handle, the overlay with `_scratch`.
pub struct Booted {
    pub vm: v2m::qemu::QemuVm,
    /// Accelerator used and why.
    pub accel: v2m::qemu::AccelChoice,
    _scratch: tempfile::TempDir,
}

/// Boots an image on a throw-away qcow2 overlay through the V2M QEMU plugin.
pub fn boot(
    m: &Manifest,
    image: &Path,
    vcpus: u32,
    memory: u64,
    accel: AccelPolicy,
    run_dir: &Path,
    qemu: &Path,
) -> Result<Booted> {
    let (kernel, initrd, root) = (
        part(m, image, "kernel")?,
        part(m, image, "initrd")?,
        part(m, image, "root")?,
    );
    let scratch = tempfile::Builder::new()
        .prefix("vse-run-")
        .tempdir()
        .context("creating a scratch directory for the VM's disk overlay")?;
    let qemu_img =
        find_binary(Path::new("qemu-img")).ok_or_else(|| v2m::V2mError::BinaryNotFound {
            binary: "qemu-img".into(),
            hint: "apt-get install qemu-utils".into(),
        })?;
    let overlay = scratch.path().join("root.qcow2");
    create_overlays(
        &qemu_img,
        &[OverlayRequest {
            base: root.clone(),
            base_format: DiskFormat::Raw,
            path: overlay.clone(),
        }],
    )?;
    let name: VmName = format!("run-{}", std::process::id())
        .parse()
        .map_err(|e| anyhow!("VM name: {e}"))?;
    let mut profile = Profile::new(
        name,
        vcpus,
        memory,
        ImageRef {
            kernel,
            initrd: Some(initrd),
            root_disk: Some(root),
            cmdline: m.kernel_cmdline.clone(),
        },
    );
    profile.disks.push(Disk {
        path: overlay,
        format: DiskFormat::Qcow2,
        readonly: false,
    });
    let plugin = QemuPlugin::new(QemuConfig {
        binary: qemu.to_path_buf(),
        run_root: run_dir.to_path_buf(),
        accel,
        die_with_parent: true,
        ephemeral: true,
        ..QemuConfig::default()
    });
    let mut vm = plugin.define_qemu(&profile)?;
    vm.start().context("starting the VM")?;
    let accel = vm
        .accel()
        .cloned()
        .ok_or_else(|| anyhow!("the started VM reports no accelerator"))?;
    Ok(Booted {
        vm,
        accel,
        _scratch: scratch,
    })
}

/// Connects to the VM's agent channel and waits for the agent's `Ready`.
pub fn wait_agent(
    vm: &dyn Vm,
    boot_timeout: Duration,
) -> Result<vse_guest_agent::Client<UnixStream, UnixStream>> {
    let sock = vm
        .agent_socket()
        .ok_or_else(|| anyhow!("the VM has no guest agent channel"))?;
    connect_agent(sock, boot_timeout)
}

/// Connects to an agent socket (QEMU creates it shortly after start) and waits for `Ready`.
pub fn connect_agent(
    sock: &Path,
    boot_timeout: Duration,
) -> Result<vse_guest_agent::Client<UnixStream, UnixStream>> {
    let deadline = Instant::now() + boot_timeout;
    let conn = loop {
        match UnixStream::connect(sock) {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("connecting to {}", sock.display()));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    conn.set_read_timeout(Some(boot_timeout))?;
    let ctl = conn.try_clone()?;
    let client = vse_guest_agent::Client::connect(conn.try_clone()?, conn)
        .with_context(|| format!("waiting up to {boot_timeout:?} for the guest agent's ready"))?;
    // The deadline bounds the boot only: a command may stay silent for as long as it likes
    // (a VM that dies closes the socket, which ends any wait).
    ctl.set_read_timeout(None)?;
    Ok(client)
}

/// Waits for the agent, runs `argv`, asks the agent to power off. With `live`, the output
/// goes to this process's stdout/stderr as the guest writes it (and is not collected).
fn exec_in_guest(
    vm: &dyn Vm,
    argv: &[String],
    boot_timeout: Duration,
    live: bool,
) -> Result<(String, vse_guest_agent::client::ExecOutput)> {
    use std::io::Write;
    use vse_guest_agent::protocol::OutStream;
    let mut client = wait_agent(vm, boot_timeout)?;
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let status = client
        .exec_stream(&args, &Default::default(), |s, d| match (s, live) {
            (OutStream::Stdout, true) => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(d.as_bytes()).and_then(|_| o.flush());
            }
            (OutStream::Stderr, true) => {
                let _ = std::io::stderr().write_all(d.as_bytes());
            }
            (OutStream::Stdout, false) => stdout.push_str(d),
            (OutStream::Stderr, false) => stderr.push_str(d),
        })
        .with_context(|| format!("running {argv:?} in the guest"))?;
    let out = vse_guest_agent::client::ExecOutput {
        status,
        stdout,
        stderr,
    };
    // Best effort: the forced stop afterwards covers an agent that does not answer.
    let _ = client.shutdown();
    Ok((client.kernel.clone(), out))
}
