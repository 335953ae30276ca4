//! The QEMU plugin (default): `qemu-system-x86_64` with direct kernel boot, controlled over QMP
//! on a unix socket. One run directory per VM holds its sockets, console log and metadata, so
//! a later process can attach to a VM started by an earlier one.

pub mod accel;
pub mod cmdline;

mod migration;
mod netfd;
mod process;
mod qmp;
pub mod sandbox;
mod statefile;
mod storage;
mod vm;

pub use crate::which::find_binary;
pub use accel::{Accel, AccelChoice, AccelPolicy};
pub use vm::QemuVm;

use crate::error::{Result, V2mError};
use crate::names::VmName;
use crate::plugin::{
    Availability, Capabilities, DiskMigration, Explanation, MigrationTarget, Plugin, PluginKind, Vm,
};
use crate::profile::Profile;
use crate::state::Operation;
use cmdline::{Launch, RunPaths};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct QemuConfig {
    /// `qemu-system-x86_64`, or a path. Bare names are looked up in `PATH`.
    pub binary: PathBuf,
    /// Parent of the per-VM run directories (unix socket paths must stay < 108 bytes).
    pub run_root: PathBuf,
    pub accel: AccelPolicy,
    /// Longest wait for any single QMP reply.
    pub qmp_timeout: Duration,
    /// Kill QEMU when the thread that started it exits (tests, launcher); the CLI turns it off
    /// because `vse vm start` leaves the VM running for later commands.
    pub die_with_parent: bool,
    /// Remove the VM's run directory (console log, profile) when the VM goes: jobs do, so
    /// finished jobs leave nothing behind; `vse vm` keeps it for later inspection.
    pub ephemeral: bool,
    /// QEMU starts with SIGTERM blocked (launch VMs). A batch system ending a job signals every
    /// process of it at once, and QEMU turns any SIGTERM into an immediate exit (whatever
    /// `-action` says); blocked, the signal stays pending while the job's checkpoint saves the
    /// VM, and vse ends QEMU itself (QMP `quit`, or SIGKILL, as does the batch system's).
    pub hold_sigterm: bool,
}

impl Default for QemuConfig {
    fn default() -> Self {
        QemuConfig {
            binary: "qemu-system-x86_64".into(),
            run_root: "/run/vse/v2m".into(),
            accel: AccelPolicy::Auto,
            qmp_timeout: Duration::from_secs(30),
            die_with_parent: true,
            ephemeral: false,
            hold_sigterm: false,
        }
    }
}

impl QemuConfig {
    pub fn resolve_binary(&self) -> Result<PathBuf> {
        find_binary(&self.binary).ok_or_else(|| V2mError::BinaryNotFound {
            binary: self.binary.clone(),
            hint: "apt-get install qemu-system-x86, or point --qemu at the binary".into(),
        })
    }
}

pub struct QemuPlugin {
    cfg: QemuConfig,
}

impl QemuPlugin {
    pub fn new(cfg: QemuConfig) -> Self {
        QemuPlugin { cfg }
    }

    pub fn config(&self) -> &QemuConfig {
        &self.cfg
    }

    /// Typed handle (for callers that need QEMU specifics such as the accelerator choice).
    pub fn define_qemu(&self, profile: &Profile) -> Result<QemuVm> {
        QemuVm::define(&self.cfg, profile)
    }
}

impl Plugin for QemuPlugin {
    fn kind(&self) -> PluginKind {
        PluginKind::Qemu
    }

    fn probe(&self) -> Availability {
        let Some(bin) = find_binary(&self.cfg.binary) else {
            return Availability::NotAvailable {
                reason: format!(
                    "{} not found in PATH (apt-get install qemu-system-x86)",
                    self.cfg.binary.display()
                ),
            };
        };
        match std::process::Command::new(&bin).arg("--version").output() {
            Ok(o) if o.status.success() => {
                let v = String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                Availability::Available {
                    detail: format!(
                        "{v} at {}; accelerator policy {:?} (KVM only after a functional boot check)",
                        bin.display(),
                        self.cfg.accel
                    ),
                }
            }
            Ok(o) => Availability::NotAvailable {
                reason: format!("{} --version failed: {}", bin.display(), o.status),
            },
            Err(e) => Availability::NotAvailable {
                reason: format!("cannot run {}: {e}", bin.display()),
            },
        }
    }

    fn capabilities(&self) -> Capabilities {
        use Operation as O;
        Capabilities {
            operations: vec![
                O::Define, O::Start, O::Stop, O::Pause, O::Resume, O::Migrate, O::PrepareIncoming,
                O::FinishIncoming, O::Checkpoint, O::Restore, O::ConsoleLog, O::VcpuThreads,
            ],
            disk_copy: true,
            notes: vec![
                "live migration over TCP between two QEMU processes (any hosts, including one host)".into(),
                "migration without shared storage: the overlays' allocated clusters are mirrored to the destination's NBD export (TLS-PSK) before the memory".into(),
                "vCPU threads pinned with sched_setaffinity; memory bound with memory-backend-ram host-nodes/policy=bind".into(),
            ],
        }
    }

    fn explain(&self, profile: &Profile) -> Result<Explanation> {
        profile.validate()?;
        let bin = find_binary(&self.cfg.binary).unwrap_or_else(|| self.cfg.binary.clone());
        let choice = accel::choose(
            self.cfg.accel,
            &bin,
            &profile.image.kernel,
            &self.cfg.run_root,
        );
        let paths = RunPaths::new(&self.cfg.run_root, profile);
        let argv = cmdline::argv(&bin, profile, &paths, choice.accel, Launch::Fresh);
        Ok(Explanation {
            plugin: PluginKind::Qemu,
            format: "argv".into(),
            text: format!(
                "# accelerator: {} ({})\n{}\n",
                choice.accel.as_str(),
                choice.reason,
                cmdline::shell_line(&argv)
            ),
            argv,
        })
    }

    fn define(&self, profile: &Profile) -> Result<Box<dyn Vm>> {
        Ok(Box::new(QemuVm::define(&self.cfg, profile)?))
    }

    fn prepare_incoming(&self, profile: &Profile, listen: &MigrationTarget) -> Result<Box<dyn Vm>> {
        let mut vm = QemuVm::define(&self.cfg, profile)?;
        vm.spawn(Launch::Incoming)?;
        let address = format!("{}:{}", listen.host, listen.port);
        vm.listen(&listen.uri(), &address, listen.key.as_ref())?;
        let port = if listen.port == 0 {
            vm.bound_port()?
        } else {
            listen.port
        };
        let disks = match listen.disks {
            DiskMigration::Shared => DiskMigration::Shared,
            DiskMigration::Copy { port } => {
                match vm.export_disks(&listen.host, port, listen.key.is_some()) {
                    Ok(port) => DiskMigration::Copy { port },
                    Err(e) => {
                        vm.kill_and_clean();
                        return Err(e);
                    }
                }
            }
        };
        vm.set_incoming(MigrationTarget {
            host: listen.host.clone(),
            port,
            key: None,
            disks,
        })?;
        Ok(Box::new(vm))
    }

    fn restore_paused(&self, profile: &Profile, checkpoint: &Path) -> Result<Box<dyn Vm>> {
        if !checkpoint.is_file() {
            return Err(V2mError::CheckpointFailed {
                vm: profile.name.to_string(),
                message: format!("checkpoint file {} does not exist", checkpoint.display()),
            });
        }
        // Opened here, not by QEMU: its sandbox lets it start no `cat`, and a descriptor is
        // read as the file it was when opened, whatever the path names later.
        let file = std::fs::File::open(checkpoint)
            .map_err(|e| V2mError::io("opening checkpoint", checkpoint, e))?;
        let mut vm = QemuVm::define(&self.cfg, profile)?;
        vm.spawn(Launch::Incoming)?;
        vm.listen_fd(file.into(), &checkpoint.display().to_string())?;
        vm.wait_incoming(Duration::from_secs(600))
            .map_err(|e| match e {
                V2mError::ProcessDied { vm, status, stderr } => V2mError::CheckpointFailed {
                    vm,
                    message: format!("QEMU exited while loading the checkpoint ({status}){stderr}"),
                },
                other => other,
            })?;
        // A checkpoint is taken paused, and the loaded state stays so.
        Ok(Box::new(vm))
    }

    fn attach(&self, name: &VmName) -> Result<Box<dyn Vm>> {
        Ok(Box::new(QemuVm::attach(&self.cfg, name)?))
    }
}
