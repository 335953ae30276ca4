//! The libvirt plugin: the same life cycle through a real libvirtd (`qemu:///system`) with the
//! `virt` crate; the domain XML is generated from the profile ([`xml`]).
//!
//! What libvirt supports here, tested by the conformance suite:
//! - define/start/pause/resume/stop, console log, agent channel, vCPU pinning (`<cputune>`);
//! - checkpoint = `virDomainSave`: libvirt stops the domain after saving, so unlike QEMU the
//!   VM is *stopped* afterwards (the report and the state say so); restore = `virDomainRestore`;
//! - live migration needs a second libvirtd: libvirt refuses to migrate a domain to the host it
//!   runs on, which the plugin reports as `Unsupported` (with libvirt's own message). A
//!   destination is prepared by the destination libvirtd itself, so `prepare_incoming` is
//!   `Unsupported` too.

mod vm;
pub mod xml;

use crate::error::{Result, V2mError};
use crate::names::VmName;
use crate::plugin::{
    Availability, Capabilities, Explanation, MigrationTarget, Plugin, PluginKind, Vm,
};
use crate::profile::Profile;
use crate::qemu::{AccelPolicy, accel};
use crate::state::Operation;
use std::path::{Path, PathBuf};
pub use vm::LibvirtVm;

#[derive(Debug, Clone)]
pub struct LibvirtConfig {
    pub uri: String,
    /// Per-VM directories for console logs (libvirt opens them as root and hands QEMU the fd).
    pub run_root: PathBuf,
    pub emulator: PathBuf,
    pub accel: AccelPolicy,
    /// Remove a VM's console directory when the VM goes (jobs; see `QemuConfig::ephemeral`).
    pub ephemeral: bool,
}

impl Default for LibvirtConfig {
    fn default() -> Self {
        LibvirtConfig {
            uri: "qemu:///system".into(),
            run_root: "/run/vse/libvirt".into(),
            emulator: "qemu-system-x86_64".into(),
            accel: AccelPolicy::Auto,
            ephemeral: false,
        }
    }
}

pub struct LibvirtPlugin {
    cfg: LibvirtConfig,
}

pub(crate) fn err(operation: &str, e: virt::error::Error) -> V2mError {
    V2mError::Libvirt {
        operation: operation.into(),
        message: e.message().to_string(),
    }
}

impl LibvirtPlugin {
    pub fn new(cfg: LibvirtConfig) -> Self {
        LibvirtPlugin { cfg }
    }

    fn connect(&self) -> Result<virt::connect::Connect> {
        virt::connect::Connect::open(Some(&self.cfg.uri)).map_err(|e| V2mError::NotAvailable {
            plugin: "libvirt",
            reason: format!(
                "cannot connect to {}: {} (start libvirtd: .ci/libvirt-up.sh)",
                self.cfg.uri,
                e.message()
            ),
        })
    }

    fn xml_for(&self, profile: &Profile) -> Result<(String, PathBuf)> {
        profile.validate()?;
        let emulator = crate::which::find_binary(&self.cfg.emulator).ok_or_else(|| {
            V2mError::BinaryNotFound {
                binary: self.cfg.emulator.clone(),
                hint: "apt-get install qemu-system-x86".into(),
            }
        })?;
        let choice = accel::choose(
            self.cfg.accel,
            &emulator,
            &profile.image.kernel,
            &self.cfg.run_root,
        );
        let console = profile.console.log.clone().unwrap_or_else(|| {
            self.cfg
                .run_root
                .join(profile.name.as_str())
                .join("console.log")
        });
        Ok((
            xml::domain_xml(profile, &emulator, &console, choice.accel),
            console,
        ))
    }
}

impl Plugin for LibvirtPlugin {
    fn kind(&self) -> PluginKind {
        PluginKind::Libvirt
    }

    fn probe(&self) -> Availability {
        match virt::connect::Connect::open(Some(&self.cfg.uri)) {
            Ok(c) => {
                let v = c
                    .lib_version()
                    .map(|v| format!("{}.{}.{}", v / 1_000_000, v / 1000 % 1000, v % 1000))
                    .unwrap_or_default();
                Availability::Available {
                    detail: format!("libvirt {v} at {}", self.cfg.uri),
                }
            }
            Err(e) => Availability::NotAvailable {
                reason: format!(
                    "cannot connect to {}: {} (is libvirtd running? .ci/libvirt-up.sh)",
                    self.cfg.uri,
                    e.message()
                ),
            },
        }
    }

    fn capabilities(&self) -> Capabilities {
        use Operation as O;
        Capabilities {
            operations: vec![O::Define, O::Start, O::Stop, O::Pause, O::Resume, O::Checkpoint, O::Restore, O::ConsoleLog, O::VcpuThreads],
            disk_copy: false,
            notes: vec![
                "checkpoint (virDomainSave) leaves the domain stopped, not paused".into(),
                "live migration only between two libvirtd hosts; same-host migration is refused by libvirt".into(),
            ],
        }
    }

    fn explain(&self, profile: &Profile) -> Result<Explanation> {
        let (text, _) = self.xml_for(profile)?;
        Ok(Explanation {
            plugin: PluginKind::Libvirt,
            format: "domain-xml".into(),
            argv: Vec::new(),
            text,
        })
    }

    fn define(&self, profile: &Profile) -> Result<Box<dyn Vm>> {
        let (xml, console) = self.xml_for(profile)?;
        let conn = self.connect()?;
        let mut vm = LibvirtVm::define(conn, profile, &xml, console)?;
        if self.cfg.ephemeral && profile.console.log.is_none() {
            vm.remove_on_drop = Some(self.cfg.run_root.join(profile.name.as_str()));
        }
        Ok(Box::new(vm))
    }

    fn prepare_incoming(&self, _: &Profile, _: &MigrationTarget) -> Result<Box<dyn Vm>> {
        Err(V2mError::Unsupported {
            plugin: "libvirt",
            operation: Operation::PrepareIncoming,
            reason: "the destination libvirtd prepares incoming domains itself; migrate with the destination host's address".into(),
        })
    }

    fn restore_paused(&self, profile: &Profile, checkpoint: &Path) -> Result<Box<dyn Vm>> {
        let conn = self.connect()?;
        let console = profile.console.log.clone().unwrap_or_else(|| {
            self.cfg
                .run_root
                .join(profile.name.as_str())
                .join("console.log")
        });
        Ok(Box::new(LibvirtVm::restore(
            conn, profile, checkpoint, console,
        )?))
    }

    fn attach(&self, name: &VmName) -> Result<Box<dyn Vm>> {
        let conn = self.connect()?;
        let console = self.cfg.run_root.join(name.as_str()).join("console.log");
        Ok(Box::new(LibvirtVm::attach(
            conn,
            name,
            console,
            &self.cfg.run_root,
        )?))
    }
}
