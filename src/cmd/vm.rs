//! `vse vm …`: admin and debugging access to V2M. Each invocation is short-lived: `start`
//! leaves the VM running (its handle is detached) and later commands re-attach by name through
//! the VM's run directory. Every command has `--json`.

use crate::exit::Failure;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use v2m::qemu::{AccelPolicy, QemuConfig};
use v2m::registry::{self, Settings};
use v2m::{MigrationParams, MigrationTarget, Plugin, PluginKind, Profile, Vm, VmName};

#[derive(Debug, Args)]
pub struct VmArgs {
    #[command(subcommand)]
    cmd: VmCommand,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct Common {
    /// Backend; default: the first available of qemu, libvirt, xen, palacios.
    #[arg(long, global = true)]
    plugin: Option<PluginKind>,
    /// Parent of the per-VM run directories (sockets, console log, metadata).
    /// Default: root's /run/vse/v2m, a user's $XDG_RUNTIME_DIR/vse or /tmp/vse-run-UID.
    #[arg(long, global = true, env = "VSE_RUN_DIR")]
    run_dir: Option<PathBuf>,
    /// QEMU binary.
    #[arg(long, global = true, default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
    /// Accelerator: auto = KVM only if a functional boot check passes, else TCG.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_accel)]
    accel: AccelPolicy,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
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

#[derive(Debug, Subcommand)]
enum VmCommand {
    /// Define and boot a VM from a profile (YAML or JSON); it keeps running after this command.
    Start {
        profile: PathBuf,
    },
    /// Stop a VM: ask the guest to power off, wait, then force it.
    Stop {
        name: VmName,
        /// Seconds to wait for a guest power-off before forcing.
        #[arg(long, default_value_t = 10)]
        grace: u64,
    },
    Pause {
        name: VmName,
    },
    Resume {
        name: VmName,
    },
    /// One VM's status, or (without a name) every plugin's probe result.
    Status {
        name: Option<VmName>,
    },
    /// Live-migrate a VM: to a destination prepared with `vse vm receive` (--to), or to a new
    /// VM on this host (--local NEW-NAME).
    Migrate {
        name: VmName,
        #[arg(long, conflicts_with = "local", required_unless_present = "local")]
        to: Option<String>,
        #[arg(long)]
        local: Option<VmName>,
        /// Bandwidth limit, MiB/s.
        #[arg(long, default_value_t = 1024)]
        bandwidth_mib: u64,
        /// Maximum tolerated downtime, ms.
        #[arg(long, default_value_t = 300)]
        downtime_ms: u64,
    },
    /// Destination side of a migration between hosts: listen, wait for the VM, leave it running.
    Receive {
        profile: PathBuf,
        /// host:port to listen on (port 0: any free port, printed). QEMU's migration stream
        /// is not authenticated: listen on a private (job network) address, never a public one.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Seconds to wait for the source.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Write the VM's whole state to a file; the VM stays paused.
    Checkpoint {
        name: VmName,
        #[arg(long)]
        file: PathBuf,
    },
    /// Start a VM from a checkpoint; the profile defaults to the one the VM was started with.
    Restore {
        name: VmName,
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Show the exact command line / configuration a plugin would produce for a profile.
    Explain {
        #[arg(required_unless_present = "example")]
        profile: Option<PathBuf>,
        /// Print an example profile instead.
        #[arg(long)]
        example: bool,
    },
}

impl Common {
    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(vse_base::run_root)
    }
}

pub fn run(a: VmArgs) -> Result<ExitCode> {
    let c = &a.common;
    let settings = Settings {
        qemu: QemuConfig {
            binary: c.qemu.clone(),
            run_root: c.run_dir(),
            accel: c.accel,
            die_with_parent: false,
            ..QemuConfig::default()
        },
        libvirt: v2m::libvirt::LibvirtConfig {
            run_root: c.run_dir().join("libvirt"),
            emulator: c.qemu.clone(),
            accel: c.accel,
            ..Default::default()
        },
    };
    let plugin = || registry::select(&settings, c.plugin);
    match &a.cmd {
        VmCommand::Status { name: None } => probes(c, &settings)?,
        VmCommand::Status { name: Some(n) } => {
            let mut vm = plugin()?.attach(n)?;
            let st = vm.status()?;
            vm.detach();
            print(c.json, &st, || status_text(&st))?;
        }
        VmCommand::Start { profile } => {
            let mut vm = plugin()?.define(&load(profile)?)?;
            vm.start()?;
            let st = vm.status()?;
            vm.detach();
            print(c.json, &st, || {
                let accel = st.accel.clone().unwrap_or("-".into());
                format!("{} started ({}, accel {accel})", st.name, st.plugin)
            })?;
        }
        VmCommand::Stop { name, grace } => {
            let out = plugin()?.attach(name)?.stop(Duration::from_secs(*grace))?;
            print(c.json, &out, || {
                let how = serde_json::to_string(&out).unwrap_or_default();
                format!("{name} stopped ({})", how.trim_matches('"'))
            })?;
        }
        VmCommand::Pause { name } => {
            simple(c.json, plugin()?.as_ref(), name, "paused", |vm| vm.pause())?
        }
        VmCommand::Resume { name } => simple(c.json, plugin()?.as_ref(), name, "resumed", |vm| {
            vm.resume()
        })?,
        VmCommand::Migrate {
            name,
            to,
            local,
            bandwidth_mib,
            downtime_ms,
        } => {
            let params = MigrationParams {
                max_bandwidth_bytes_per_s: bandwidth_mib << 20,
                downtime_limit_ms: *downtime_ms,
                timeout: Duration::from_secs(3600),
            };
            migrate(
                c,
                plugin()?.as_ref(),
                name,
                to.as_deref(),
                local.as_ref(),
                &params,
            )?
        }
        VmCommand::Receive {
            profile,
            listen,
            timeout,
        } => receive(c, plugin()?.as_ref(), profile, listen, *timeout)?,
        VmCommand::Checkpoint { name, file } => {
            let mut vm = plugin()?.attach(name)?;
            let bar = spinner(c.json, format!("checkpointing {name}"));
            let r = vm.checkpoint(file)?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            vm.detach();
            print(c.json, &r, || {
                let (n, p, ms) = (r.bytes, r.path.display(), r.duration_ms);
                format!("{name}: {n} bytes to {p} in {ms} ms (VM paused)")
            })?;
        }
        VmCommand::Restore {
            name,
            file,
            profile,
        } => {
            let path = profile
                .clone()
                .unwrap_or_else(|| c.run_dir().join(name.as_str()).join("profile.json"));
            let mut p = load(&path)?;
            p.name = name.clone();
            let mut vm = plugin()?.restore(&p, file)?;
            let st = vm.status()?;
            vm.detach();
            print(c.json, &st, || {
                let (n, f, s) = (&st.name, file.display(), st.state);
                format!("{n} restored from {f} and {s}")
            })?;
        }
        VmCommand::Explain { profile, example } => {
            explain(c, &settings, profile.as_deref(), *example)?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every plugin's probe result.
fn probes(c: &Common, settings: &Settings) -> Result<()> {
    let probes = registry::probe_all(settings);
    if c.json {
        println!("{}", serde_json::to_string_pretty(&probes)?);
        return Ok(());
    }
    for p in probes {
        match p.availability {
            v2m::Availability::Available { detail } => {
                println!("{:<9} available: {detail}", p.plugin)
            }
            v2m::Availability::NotAvailable { reason } => {
                println!("{:<9} not available: {reason}", p.plugin)
            }
        }
    }
    Ok(())
}

fn status_text(st: &v2m::VmStatus) -> String {
    let path = |p: &Option<PathBuf>| p.as_ref().map_or("-".into(), |p| p.display().to_string());
    format!(
        "{}: {} ({}, pid {}, accel {})\nconsole: {}\nagent: {}",
        st.name,
        st.state,
        st.plugin,
        st.pid.map_or("-".into(), |p| p.to_string()),
        st.accel.clone().unwrap_or("-".into()),
        path(&st.console_log),
        path(&st.agent_socket),
    )
}

/// Live-migrates `name` to a prepared destination (`to`) or to a new VM on this host (`local`).
fn migrate(
    c: &Common,
    pl: &dyn Plugin,
    name: &VmName,
    to: Option<&str>,
    local: Option<&VmName>,
    params: &MigrationParams,
) -> Result<()> {
    let mut src = pl.attach(name)?;
    let bar = spinner(c.json, format!("migrating {name}"));
    let report = match (to, local) {
        (Some(to), _) => src.migrate(&parse_target(to)?, params)?,
        (None, Some(new)) => {
            let stored = c.run_dir().join(name.as_str()).join("profile.json");
            let mut p = load(&stored)?;
            p.name = new.clone();
            p.console.log = None;
            let listen = MigrationTarget {
                host: "127.0.0.1".into(),
                port: 0,
                key: None,
                disks: Default::default(),
            };
            let mut dst = pl.prepare_incoming(&p, &listen)?;
            let target = dst
                .incoming()
                .cloned()
                .context("destination did not report its address")?;
            let r = src.migrate(&target, params)?;
            dst.finish_incoming(Duration::from_secs(600))?;
            dst.detach();
            r
        }
        (None, None) => unreachable!("clap requires --to or --local"),
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    print(c.json, &report, || {
        format!(
            "{name} migrated: total {} ms, downtime {} ms, {:.1} MiB transferred (limits: {} MiB/s, {} ms)",
            report.total_time_ms,
            report.downtime_ms,
            report.transferred_bytes as f64 / 1048576.0,
            report.max_bandwidth_bytes_per_s >> 20,
            report.downtime_limit_ms
        )
    })
}

/// The destination side: listen, wait for the VM, leave it running.
fn receive(c: &Common, pl: &dyn Plugin, profile: &Path, listen: &str, timeout: u64) -> Result<()> {
    let mut vm = pl.prepare_incoming(&load(profile)?, &parse_target(listen)?)?;
    let t = vm
        .incoming()
        .cloned()
        .context("destination did not report its address")?;
    // The address goes out first (stderr in JSON mode) so the source side can be started.
    if c.json {
        eprintln!("listening on {}:{}", t.host, t.port);
    } else {
        println!("listening on {}:{}", t.host, t.port);
    }
    vm.finish_incoming(Duration::from_secs(timeout))?;
    let st = vm.status()?;
    vm.detach();
    print(c.json, &st, || {
        format!("{} arrived and is {}", st.name, st.state)
    })
}

/// What a plugin would run for a profile (or an example profile).
fn explain(c: &Common, settings: &Settings, profile: Option<&Path>, example: bool) -> Result<()> {
    if example {
        let p = example_profile();
        if c.json {
            println!("{}", p.to_json());
        } else {
            print!("{}", p.to_yaml());
        }
        return Ok(());
    }
    let p = load(profile.expect("clap requires a profile unless --example"))?;
    // Explaining works without the hypervisor, so take the plugin as named, unprobed.
    let kind = c.plugin.unwrap_or(PluginKind::Qemu);
    let pl = registry::all(settings)
        .into_iter()
        .find(|pl| pl.kind() == kind)
        .ok_or_else(|| {
            Failure::invalid(format!("plugin {kind} is not compiled into this build"))
        })?;
    let e = pl.explain(&p)?;
    print(c.json, &e, || e.text.clone())
}

fn simple(
    json: bool,
    pl: &dyn Plugin,
    name: &VmName,
    verb: &str,
    f: impl FnOnce(&mut dyn Vm) -> v2m::Result<()>,
) -> Result<()> {
    let mut vm = pl.attach(name)?;
    f(&mut *vm)?;
    let st = vm.status()?;
    vm.detach();
    print(json, &st, || format!("{name} {verb}"))
}

fn print<T: Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        println!("{}", text());
    }
    Ok(())
}

fn spinner(json: bool, msg: String) -> Option<indicatif::ProgressBar> {
    (!json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b.set_message(msg);
        b
    })
}

fn load(path: &Path) -> Result<Profile> {
    Ok(Profile::load(path)?)
}

fn parse_target(s: &str) -> Result<MigrationTarget> {
    let (host, port) = s.rsplit_once(':').ok_or_else(|| {
        Failure::invalid(format!(
            "migration address {s:?}: expected HOST:PORT, e.g. 10.0.0.2:4444"
        ))
    })?;
    let port = port.parse().map_err(|_| {
        Failure::invalid(format!(
            "migration address {s:?}: port {port:?} is not a number 0-65535"
        ))
    })?;
    Ok(MigrationTarget {
        host: host.trim_matches(['[', ']']).to_string(),
        port,
        key: None,
        disks: Default::default(),
    })
}

fn example_profile() -> Profile {
    let mut p = Profile::new(
        "job42-n3".parse().expect("valid name"),
        2,
        1024,
        v2m::ImageRef {
            kernel: "/var/cache/vse/fixtures/kernel/boot/vmlinuz".into(),
            initrd: Some("/var/cache/vse/fixtures/initrd.cpio.gz".into()),
            root_disk: None,
            cmdline: "console=ttyS0 panic=-1 quiet".into(),
        },
    );
    p.cpuset = "0-1".parse().ok();
    p.numa_node = Some(0);
    p.network = v2m::Network {
        mode: v2m::NetMode::User,
        mac: "52:54:00:2a:00:03".parse().ok(),
        hostname: "job42-n3".parse().ok(),
        ..Default::default()
    };
    p
}
