//! One libvirt domain behind the [`Vm`] trait. Dropping an owned handle destroys and undefines
//! the domain, so no test or failed launch leaves domains behind.

use super::err;
use crate::error::{Result, V2mError};
use crate::names::VmName;
use crate::plugin::{
    CheckpointReport, MigrationParams, MigrationReport, MigrationTarget, PluginKind, StopOutcome,
    VcpuThread, Vm, VmStatus,
};
use crate::profile::Profile;
use crate::state::{Operation, VmState};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState};

// The connection is kept for the domain's lifetime (virt closes it on drop).

pub struct LibvirtVm {
    // Held so the connection outlives the domain handle (virt closes it on drop).
    _conn: Connect,
    dom: Domain,
    name: VmName,
    state: VmState,
    console: PathBuf,
    agent: Option<PathBuf>,
    owned: bool,
    /// The VM's console directory, removed with the VM (ephemeral plugins).
    pub(super) remove_on_drop: Option<PathBuf>,
}

impl LibvirtVm {
    pub(super) fn define(
        conn: Connect,
        profile: &Profile,
        xml: &str,
        console: PathBuf,
    ) -> Result<LibvirtVm> {
        if conn.lookup_domain_by_name(profile.name.as_str()).is_ok() {
            return Err(V2mError::AlreadyExists {
                name: profile.name.to_string(),
                run_dir: PathBuf::from("libvirt"),
            });
        }
        if let Some(dir) = console.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| V2mError::io("creating console directory", dir, e))?;
        }
        let dom = conn.define_domain_xml(xml).map_err(|e| err("define", e))?;
        Ok(LibvirtVm {
            _conn: conn,
            dom,
            name: profile.name.clone(),
            state: VmState::Defined,
            console,
            agent: None,
            owned: true,
            remove_on_drop: None,
        })
    }

    pub(super) fn attach(
        conn: Connect,
        name: &VmName,
        console: PathBuf,
        run_root: &Path,
    ) -> Result<LibvirtVm> {
        let dom = conn
            .lookup_domain_by_name(name.as_str())
            .map_err(|_| V2mError::NotFound {
                name: name.to_string(),
                run_dir: run_root.to_path_buf(),
            })?;
        let mut vm = LibvirtVm {
            _conn: conn,
            dom,
            name: name.clone(),
            state: VmState::Defined,
            console,
            agent: None,
            owned: false,
            remove_on_drop: None,
        };
        vm.sync()?;
        Ok(vm)
    }

    pub(super) fn restore(
        conn: Connect,
        profile: &Profile,
        file: &Path,
        console: PathBuf,
    ) -> Result<LibvirtVm> {
        if !file.is_file() {
            return Err(V2mError::CheckpointFailed {
                vm: profile.name.to_string(),
                message: format!("checkpoint file {} does not exist", file.display()),
            });
        }
        conn.restore_domain_flags(
            &file.to_string_lossy(),
            None,
            virt::sys::VIR_DOMAIN_SAVE_PAUSED,
        )
        .map_err(|e| err("restore", e))?;
        let dom = conn
            .lookup_domain_by_name(profile.name.as_str())
            .map_err(|e| err("restore: lookup", e))?;
        let mut vm = LibvirtVm {
            _conn: conn,
            dom,
            name: profile.name.clone(),
            state: VmState::Running,
            console,
            agent: None,
            owned: true,
            remove_on_drop: None,
        };
        vm.sync()?;
        // Restored paused: the plugin's `restore` resumes it.
        Ok(vm)
    }

    fn sync(&mut self) -> Result<()> {
        let active = self.dom.is_active().map_err(|e| err("is_active", e))?;
        let (st, _) = self.dom.state().map_err(|e| err("state", e))?;
        self.state = match st.known() {
            Some(DomainState::Running | DomainState::Blocked) => VmState::Running,
            Some(DomainState::Paused | DomainState::PMSuspended) => VmState::Paused,
            _ if !active && self.state == VmState::Defined => VmState::Defined,
            _ => VmState::Stopped,
        };
        if active && self.agent.is_none() {
            let xml = self.dom.xml_desc(0).map_err(|e| err("xml_desc", e))?;
            self.agent = super::xml::agent_socket_from_live_xml(&xml).map(PathBuf::from);
        }
        if !active {
            self.agent = None;
        }
        Ok(())
    }

    fn check(&mut self, op: Operation) -> Result<VmState> {
        // Stopped is terminal: the domain is undefined by then, so there is nothing to ask.
        if self.state != VmState::Stopped {
            self.sync()?;
        }
        self.state.check(self.name.as_str(), op)
    }

    fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(format!("/run/libvirt/qemu/{}.pid", self.name)).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        crate::affinity::threads_of(pid).is_ok().then_some(pid)
    }

    /// Our VMs end with their life cycle: a stopped domain is not kept as a libvirt definition.
    fn undefine(&self) {
        let _ = self.dom.undefine();
    }
}

impl Vm for LibvirtVm {
    fn name(&self) -> &VmName {
        &self.name
    }

    fn status(&mut self) -> Result<VmStatus> {
        if self.state != VmState::Stopped {
            self.sync()?;
        }
        Ok(VmStatus {
            name: self.name.clone(),
            plugin: PluginKind::Libvirt,
            state: self.state,
            pid: if self.state == VmState::Stopped {
                None
            } else {
                self.pid()
            },
            accel: None,
            console_log: Some(self.console.clone()),
            agent_socket: self.agent.clone(),
        })
    }

    fn start(&mut self) -> Result<()> {
        let next = self.check(Operation::Start)?;
        self.dom.create().map_err(|e| err("start", e))?;
        self.state = next;
        self.sync()
    }

    fn stop(&mut self, grace: Duration) -> Result<StopOutcome> {
        self.check(Operation::Stop)?;
        let mut outcome = StopOutcome::AlreadyGone;
        if self.dom.is_active().unwrap_or(false) {
            outcome = StopOutcome::Forced;
            if !grace.is_zero() && self.dom.shutdown().is_ok() {
                let start = Instant::now();
                while start.elapsed() < grace && self.dom.is_active().unwrap_or(false) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if !self.dom.is_active().unwrap_or(false) {
                    outcome = StopOutcome::Graceful;
                }
            }
            if outcome != StopOutcome::Graceful {
                self.dom.destroy().map_err(|e| err("destroy", e))?;
            }
        }
        self.undefine();
        self.state = VmState::Stopped;
        self.agent = None;
        Ok(outcome)
    }

    fn pause(&mut self) -> Result<()> {
        let next = self.check(Operation::Pause)?;
        self.dom.suspend().map_err(|e| err("suspend", e))?;
        self.state = next;
        Ok(())
    }

    fn resume(&mut self) -> Result<()> {
        let next = self.check(Operation::Resume)?;
        self.dom.resume().map_err(|e| err("resume", e))?;
        self.state = next;
        Ok(())
    }

    fn migrate(
        &mut self,
        target: &MigrationTarget,
        params: &MigrationParams,
    ) -> Result<MigrationReport> {
        let prev = self.check(Operation::Migrate)?;
        let _ = prev;
        if target.disks != crate::plugin::DiskMigration::Shared {
            // libvirt's own copy (VIR_MIGRATE_NON_SHARED_INC) needs the destination libvirtd
            // to prepare the domain, which this plugin does not drive.
            return Err(V2mError::Unsupported {
                plugin: "libvirt",
                operation: Operation::Migrate,
                reason:
                    "migration without shared storage (the disks are not copied by this plugin)"
                        .into(),
            });
        }
        if target.key.is_some() {
            // libvirt configures migration TLS for the whole daemon (qemu.conf), not per call.
            return Err(V2mError::Unsupported {
                plugin: "libvirt",
                operation: Operation::Migrate,
                reason: "a migration authenticated by a per-job key (libvirt's migration TLS is set up in its qemu.conf)".into(),
            });
        }
        let local = matches!(
            target.host.as_str(),
            "127.0.0.1" | "localhost" | "::1" | "0.0.0.0"
        );
        let uri = if local {
            "qemu:///system".to_string()
        } else {
            format!("qemu+tcp://{}:{}/system", target.host, target.port)
        };
        let dconn = Connect::open(Some(&uri))
            .map_err(|e| err(&format!("connect to destination {uri}"), e))?;
        self.dom
            .migrate_set_max_speed((params.max_bandwidth_bytes_per_s >> 20).max(1), 0)
            .map_err(|e| err("migrate_set_max_speed", e))?;
        self.dom
            .migrate_set_max_downtime(params.downtime_limit_ms, 0)
            .map_err(|e| err("migrate_set_max_downtime", e))?;
        let start = Instant::now();
        let flags = virt::sys::VIR_MIGRATE_LIVE;
        match self.dom.migrate(&dconn, flags, None, None, 0) {
            Ok(_) => {
                self.state = VmState::Stopped;
                self.agent = None;
                Ok(MigrationReport {
                    total_time_ms: start.elapsed().as_millis() as u64,
                    // libvirt does not report the downtime of a finished migration through this call.
                    downtime_ms: 0,
                    transferred_bytes: 0,
                    disk_bytes: 0,
                    storage: crate::plugin::StorageMode::Shared,
                    setup_time_ms: 0,
                    max_bandwidth_bytes_per_s: params.max_bandwidth_bytes_per_s,
                    downtime_limit_ms: params.downtime_limit_ms,
                })
            }
            Err(e) if e.message().contains("same host") || e.message().contains("already") => {
                Err(V2mError::Unsupported {
                    plugin: "libvirt",
                    operation: Operation::Migrate,
                    reason: format!(
                        "libvirt refuses migration to the host the domain runs on: {}",
                        e.message()
                    ),
                })
            }
            Err(e) => Err(V2mError::MigrationFailed {
                vm: self.name.to_string(),
                message: e.message().to_string(),
            }),
        }
    }

    fn incoming(&self) -> Option<&MigrationTarget> {
        None
    }

    fn finish_incoming(&mut self, _timeout: Duration) -> Result<()> {
        Err(V2mError::Unsupported {
            plugin: "libvirt",
            operation: Operation::FinishIncoming,
            reason: "the destination libvirtd finishes incoming migrations itself".into(),
        })
    }

    fn checkpoint(&mut self, path: &Path) -> Result<CheckpointReport> {
        self.check(Operation::Checkpoint)?;
        let started = Instant::now();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".partial-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let c = std::ffi::CString::new(tmp.to_string_lossy().as_bytes()).map_err(|_| {
            V2mError::CheckpointFailed {
                vm: self.name.to_string(),
                message: "checkpoint path contains a NUL byte".into(),
            }
        })?;
        // SAFETY: the domain pointer is valid for the life of `self.dom`; `c` outlives the call.
        // virt 0.5 does not wrap virDomainSave.
        let rc = unsafe { virt::sys::virDomainSave(self.dom.as_ptr(), c.as_ptr()) };
        if rc < 0 {
            let _ = std::fs::remove_file(&tmp);
            let e = virt::error::Error::last_error();
            return Err(V2mError::CheckpointFailed {
                vm: self.name.to_string(),
                message: e.message().to_string(),
            });
        }
        std::fs::rename(&tmp, path).map_err(|e| V2mError::io("renaming checkpoint to", path, e))?;
        self.state = VmState::Stopped;
        self.agent = None;
        let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(CheckpointReport {
            path: path.to_path_buf(),
            bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            // libvirtd writes the file: it is hashed by whoever needs the digest.
            sha256: None,
        })
    }

    fn console_log(&self) -> Result<Vec<u8>> {
        match std::fs::read(&self.console) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(V2mError::io("reading console log", &self.console, e)),
        }
    }

    fn vcpu_threads(&mut self) -> Result<Vec<VcpuThread>> {
        self.check(Operation::VcpuThreads)?;
        let pid = self.pid().ok_or_else(|| V2mError::Libvirt {
            operation: "vcpu_threads".into(),
            message: "no QEMU pid file".into(),
        })?;
        let mut out = Vec::new();
        // libvirt starts QEMU with debug-threads=on: vCPU threads are named "CPU <n>/<accel>".
        for tid in crate::affinity::threads_of(pid)
            .map_err(|e| V2mError::io("listing threads", format!("/proc/{pid}/task"), e))?
        {
            let comm =
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
            if let Some(idx) = comm
                .trim()
                .strip_prefix("CPU ")
                .and_then(|r| r.split('/').next())
                .and_then(|n| n.parse().ok())
            {
                let affinity = crate::affinity::get_affinity(tid)
                    .map_err(|e| V2mError::io("reading affinity", format!("/proc/{tid}"), e))?;
                out.push(VcpuThread {
                    index: idx,
                    thread_id: tid,
                    affinity,
                });
            }
        }
        out.sort_by_key(|t| t.index);
        Ok(out)
    }

    fn agent_socket(&self) -> Option<&Path> {
        self.agent.as_deref()
    }

    fn detach(mut self: Box<Self>) {
        self.owned = false;
    }
}

impl Drop for LibvirtVm {
    fn drop(&mut self) {
        if self.owned {
            if self.dom.is_active().unwrap_or(false) {
                let _ = self.dom.destroy();
            }
            self.undefine();
            if let Some(dir) = &self.remove_on_drop {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}
