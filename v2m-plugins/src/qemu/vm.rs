//! One QEMU VM: process, QMP connection and the state machine kept in step with QEMU's own
//! run state. Every failure path leaves no process behind and the state at `stopped`.

use super::QemuConfig;
use super::accel::{self, Accel, AccelChoice};
use super::cmdline::{self, Launch, RunPaths};
use super::netfd;
use super::process::{self, Proc};
use super::qmp::{Qmp, QmpError};
use crate::affinity as pin;
use crate::error::{Result, V2mError};
use crate::names::VmName;
use crate::plugin::{
    CheckpointReport, MigrationParams, MigrationReport, MigrationTarget, PluginKind, StopOutcome,
    VcpuThread, Vm, VmStatus,
};
use crate::profile::Profile;
use crate::state::{Operation, VmState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a later `attach` needs to find the running process again.
#[derive(Serialize, Deserialize)]
struct Meta {
    pid: u32,
    accel: AccelChoice,
    incoming: Option<MigrationTarget>,
}

pub struct QemuVm {
    pub(super) cfg: QemuConfig,
    pub(super) profile: Profile,
    pub(super) paths: RunPaths,
    pub(super) state: VmState,
    pub(super) proc_: Option<Proc>,
    pub(super) qmp: Option<Qmp>,
    pub(super) accel: Option<AccelChoice>,
    pub(super) incoming: Option<MigrationTarget>,
    /// The agent channel of a QEMU started for incoming state, connected before the state
    /// loads (see [`Vm::take_agent_channel`]).
    pub(super) agent_channel: Option<UnixStream>,
    /// Whether dropping this handle stops the VM.
    pub(super) owned: bool,
}

impl QemuVm {
    /// Validates the profile, checks the files it names and prepares the run directory.
    pub(super) fn define(cfg: &QemuConfig, profile: &Profile) -> Result<QemuVm> {
        profile.validate()?;
        cfg.resolve_binary()?;
        let mut files = vec![("image.kernel".to_string(), profile.image.kernel.clone())];
        if let Some(i) = &profile.image.initrd {
            files.push(("image.initrd".into(), i.clone()));
        }
        for (i, d) in profile.disks.iter().enumerate() {
            files.push((format!("disks[{i}].path"), d.path.clone()));
        }
        for (field, f) in files {
            if !f.is_file() {
                return Err(V2mError::InvalidProfile {
                    origin: String::new(),
                    field,
                    message: format!("{} does not exist", f.display()),
                    hint: "build the image first (`vse build`), or run .ci/fixtures.sh for the test guest".into(),
                });
            }
        }
        let paths = RunPaths::new(&cfg.run_root, profile);
        if let Ok(text) = std::fs::read_to_string(&paths.meta)
            && let Ok(meta) = serde_json::from_str::<Meta>(&text)
            && process::pid_alive(meta.pid)
        {
            return Err(V2mError::AlreadyExists {
                name: profile.name.to_string(),
                run_dir: paths.dir.clone(),
            });
        }
        // QEMU's sockets, the profile and the pid it is attached by live here: nobody else
        // may be able to plant or swap them.
        vse_base::private_dir(&cfg.run_root, "VM run directory")?;
        vse_base::private_dir(&paths.dir, "VM run directory")?;
        write_atomic(&paths.profile, profile.to_json().as_bytes())?;
        Ok(QemuVm {
            cfg: cfg.clone(),
            profile: profile.clone(),
            paths,
            state: VmState::Defined,
            proc_: None,
            qmp: None,
            accel: None,
            incoming: None,
            agent_channel: None,
            owned: true,
        })
    }

    pub(super) fn attach(cfg: &QemuConfig, name: &VmName) -> Result<QemuVm> {
        let dir = cfg.run_root.join(name.as_str());
        let not_found = || V2mError::NotFound {
            name: name.to_string(),
            run_dir: cfg.run_root.clone(),
        };
        let text = std::fs::read_to_string(dir.join("profile.json")).map_err(|_| not_found())?;
        let profile: Profile =
            serde_json::from_str(&text).map_err(|e| V2mError::InvalidProfile {
                origin: format!(" in {}", dir.join("profile.json").display()),
                field: "profile".into(),
                message: e.to_string(),
                hint: "the run directory is damaged; remove it".into(),
            })?;
        let paths = RunPaths::new(&cfg.run_root, &profile);
        let mut vm = QemuVm {
            cfg: cfg.clone(),
            profile,
            paths,
            state: VmState::Stopped,
            proc_: None,
            qmp: None,
            accel: None,
            incoming: None,
            agent_channel: None,
            owned: false,
        };
        let meta = std::fs::read_to_string(&vm.paths.meta)
            .ok()
            .and_then(|t| serde_json::from_str::<Meta>(&t).ok());
        match meta {
            Some(meta) if process::pid_alive(meta.pid) => {
                vm.proc_ = Some(Proc::Foreign(meta.pid));
                vm.accel = Some(meta.accel);
                vm.incoming = meta.incoming;
                vm.qmp = Some(
                    Qmp::connect(&vm.paths.qmp, cfg.qmp_timeout)
                        .map_err(|e| vm.qmp_err("connect", e))?,
                );
                vm.state = VmState::Running;
                vm.sync_state()?;
            }
            Some(_) => vm.state = VmState::Stopped,
            None => vm.state = VmState::Defined,
        }
        Ok(vm)
    }

    pub fn accel(&self) -> Option<&AccelChoice> {
        self.accel.as_ref()
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc_.as_ref().map(Proc::pid)
    }

    /// Starts the QEMU process, connects QMP and pins; on any error nothing is left running.
    pub(super) fn spawn(&mut self, launch: Launch) -> Result<()> {
        let binary = self.cfg.resolve_binary()?;
        super::sandbox::check(&binary)?;
        let choice = accel::choose(
            self.cfg.accel,
            &binary,
            &self.profile.image.kernel,
            &self.cfg.run_root,
        );
        let argv = cmdline::argv(&binary, &self.profile, &self.paths, choice.accel, launch);
        for p in [&self.paths.qmp, &self.paths.agent] {
            let _ = std::fs::remove_file(p);
        }
        let stderr = std::fs::File::create(&self.paths.stderr)
            .map_err(|e| V2mError::io("creating", &self.paths.stderr, e))?;
        let net = netfd::open(&self.profile.network).map_err(|e| V2mError::NetOpen {
            vm: self.profile.name.to_string(),
            message: e.to_string(),
        })?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(fd) = net.as_ref().map(|f| f.as_raw_fd()) {
            // SAFETY: pass_as only calls dup2/fcntl (async-signal-safe); `net` outlives spawn.
            unsafe {
                cmd.pre_exec(move || netfd::pass_as(fd, netfd::NET_FD));
            }
        }
        // Own process group: a Ctrl-C meant for `vse` must not kill VMs it started and detached.
        cmd.process_group(0);
        if self.cfg.die_with_parent {
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                    Ok(())
                });
            }
        }
        if self.cfg.hold_sigterm {
            // SAFETY: sigemptyset, sigaddset and sigprocmask are async-signal-safe and only
            // touch the child's own stack and signal mask.
            unsafe {
                cmd.pre_exec(|| {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGTERM);
                    libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => V2mError::BinaryNotFound {
                binary: binary.clone(),
                hint: "apt-get install qemu-system-x86".into(),
            },
            _ => V2mError::Spawn {
                binary: binary.clone(),
                source: e,
            },
        })?;
        // QEMU has its copy; ours closes here.
        drop(net);
        self.proc_ = Some(Proc::Child(child));
        self.accel = Some(choice);
        if let Err(e) = self.connect_and_pin() {
            self.kill_and_clean();
            return Err(e);
        }
        if launch == Launch::Incoming {
            // QMP answers once QEMU's main loop runs, so every chardev exists by now; the
            // state loads only after a later `migrate-incoming`.
            match UnixStream::connect(&self.paths.agent) {
                Ok(s) => self.agent_channel = Some(s),
                Err(e) => {
                    self.kill_and_clean();
                    return Err(V2mError::io("connecting to", &self.paths.agent, e));
                }
            }
        }
        self.write_meta()
    }

    fn connect_and_pin(&mut self) -> Result<()> {
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        loop {
            if let Some(status) = self.proc_.as_mut().and_then(Proc::exited) {
                return Err(self.died(status));
            }
            if self.paths.qmp.exists() {
                match Qmp::connect(&self.paths.qmp, self.cfg.qmp_timeout) {
                    Ok(q) => {
                        self.qmp = Some(q);
                        break;
                    }
                    Err(QmpError::Disconnected(_)) if start.elapsed() < limit => {}
                    Err(e) => return Err(self.qmp_err("connect", e)),
                }
            }
            if start.elapsed() >= limit {
                return Err(V2mError::Timeout {
                    what: format!("QMP socket {}", self.paths.qmp.display()),
                    after: limit,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.pin()
    }

    /// vCPU i → cpuset[i mod n]; every other QEMU thread → the whole cpuset.
    fn pin(&mut self) -> Result<()> {
        let Some(cpuset) = self.profile.cpuset.clone() else {
            return Ok(());
        };
        let cpus = cpuset.cpus().to_vec();
        let vcpus = self.query_vcpus()?;
        let pid = self.pid().unwrap_or(0);
        let bad = |e: std::io::Error| V2mError::InvalidProfile {
            origin: String::new(),
            field: "cpuset".into(),
            message: format!("cannot pin to {cpuset}: {e}"),
            hint: format!(
                "this host has CPUs 0-{}",
                std::thread::available_parallelism().map_or(0, |n| n.get() - 1)
            ),
        };
        let vcpu_tids: Vec<i32> = vcpus.iter().map(|v| v.1).collect();
        for tid in pin::threads_of(pid)
            .map_err(|e| V2mError::io("listing threads of", format!("/proc/{pid}/task"), e))?
        {
            if !vcpu_tids.contains(&tid) {
                pin::set_affinity(tid, &cpus).map_err(bad)?;
            }
        }
        for (index, tid) in vcpus {
            pin::set_affinity(tid, &[cpus[index as usize % cpus.len()]]).map_err(bad)?;
        }
        Ok(())
    }

    fn query_vcpus(&mut self) -> Result<Vec<(u32, i32)>> {
        let r = self.qmp("query-cpus-fast", None)?;
        let list = r.as_array().cloned().unwrap_or_default();
        let mut out = Vec::new();
        for c in list {
            let idx = c.get("cpu-index").and_then(Value::as_u64);
            let tid = c.get("thread-id").and_then(Value::as_i64);
            match (idx, tid) {
                (Some(i), Some(t)) => out.push((i as u32, t as i32)),
                _ => {
                    return Err(self.protocol(format!(
                        "query-cpus-fast entry without cpu-index/thread-id: {c}"
                    )));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn write_meta(&self) -> Result<()> {
        let meta = Meta {
            pid: self.pid().unwrap_or(0),
            accel: self.accel.clone().unwrap_or(AccelChoice {
                accel: Accel::Tcg,
                reason: String::new(),
                detail: String::new(),
            }),
            incoming: self.incoming.clone(),
        };
        let text = serde_json::to_string(&meta).unwrap_or_default();
        write_atomic(&self.paths.meta, text.as_bytes())
    }

    pub(super) fn protocol(&self, message: String) -> V2mError {
        V2mError::QmpProtocol {
            vm: self.profile.name.to_string(),
            message,
        }
    }

    /// Runs a QMP command; a lost connection is turned into "the process died" after checking.
    pub(super) fn qmp(&mut self, command: &str, args: Option<Value>) -> Result<Value> {
        let Some(q) = self.qmp.as_mut() else {
            return Err(self.protocol(format!(
                "no QMP connection for {command} (VM is {})",
                self.state
            )));
        };
        q.execute(command, args)
            .map_err(|e| self.qmp_err(command, e))
    }

    pub(super) fn qmp_err(&mut self, command: &str, e: QmpError) -> V2mError {
        match e {
            QmpError::Command { class, desc } => V2mError::Qmp {
                vm: self.profile.name.to_string(),
                command: command.into(),
                class,
                desc,
            },
            QmpError::Protocol(m) => self.protocol(m),
            QmpError::Disconnected(m) => {
                let gone = self
                    .proc_
                    .as_mut()
                    .map(|p| p.wait_exit(Duration::from_secs(2)))
                    .unwrap_or(true);
                if gone {
                    let status = self
                        .proc_
                        .as_mut()
                        .and_then(Proc::exited)
                        .unwrap_or_else(|| "gone".into());
                    self.died(status)
                } else {
                    self.protocol(format!("{command}: {m}"))
                }
            }
        }
    }

    /// Records the death of the process: state stopped, files cleaned, typed error returned.
    pub(super) fn died(&mut self, status: String) -> V2mError {
        let stderr = process::stderr_tail(&self.paths.stderr);
        self.qmp = None;
        self.proc_ = None;
        self.state = VmState::Stopped;
        self.clean_files();
        V2mError::ProcessDied {
            vm: self.profile.name.to_string(),
            status,
            stderr,
        }
    }

    pub(super) fn clean_files(&self) {
        if self.cfg.ephemeral {
            let _ = std::fs::remove_dir_all(&self.paths.dir);
            return;
        }
        for p in [&self.paths.qmp, &self.paths.agent, &self.paths.meta] {
            let _ = std::fs::remove_file(p);
        }
    }

    pub(super) fn kill_and_clean(&mut self) {
        self.qmp = None;
        if let Some(mut p) = self.proc_.take() {
            p.kill();
        }
        self.state = VmState::Stopped;
        self.clean_files();
    }

    /// Notices a process that died behind our back.
    pub(super) fn refresh(&mut self) -> Result<()> {
        if let Some(status) = self.proc_.as_mut().and_then(Proc::exited) {
            return Err(self.died(status));
        }
        Ok(())
    }

    pub(super) fn check(&mut self, op: Operation) -> Result<VmState> {
        if let Err(e) = self.refresh() {
            // A dead process makes every operation but stop/console invalid; report the death.
            if !matches!(op, Operation::Stop | Operation::ConsoleLog) {
                return Err(e);
            }
        }
        self.state.check(self.profile.name.as_str(), op)
    }

    /// Reads QEMU's run state into ours (used by status and attach).
    pub(super) fn sync_state(&mut self) -> Result<()> {
        let r = self.qmp("query-status", None)?;
        let s = r
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.state = match s.as_str() {
            "running" => VmState::Running,
            "inmigrate" => VmState::Migrating,
            "finish-migrate" | "postmigrate" | "paused" | "suspended" | "save-vm"
            | "restore-vm" | "debug" | "io-error" | "watchdog" | "colo" => VmState::Paused,
            "prelaunch" => VmState::Defined,
            _ => VmState::Stopped,
        };
        Ok(())
    }
}

impl Vm for QemuVm {
    fn name(&self) -> &VmName {
        &self.profile.name
    }

    fn status(&mut self) -> Result<VmStatus> {
        let _ = self.refresh();
        if matches!(self.state, VmState::Running | VmState::Paused) && self.qmp.is_some() {
            self.sync_state()?;
        }
        Ok(VmStatus {
            name: self.profile.name.clone(),
            plugin: PluginKind::Qemu,
            state: self.state,
            pid: self.pid(),
            accel: self.accel.as_ref().map(|a| a.accel.as_str().to_string()),
            console_log: Some(self.paths.console.clone()),
            agent_socket: self.proc_.as_ref().map(|_| self.paths.agent.clone()),
        })
    }

    fn start(&mut self) -> Result<()> {
        self.check(Operation::Start)?;
        self.spawn(Launch::Fresh)?;
        self.qmp("cont", None)?;
        self.state = VmState::Running;
        Ok(())
    }

    fn stop(&mut self, grace: Duration) -> Result<StopOutcome> {
        let died = self.refresh().is_err();
        self.check(Operation::Stop)?;
        if died || self.proc_.is_none() {
            self.kill_and_clean();
            return Ok(StopOutcome::AlreadyGone);
        }
        let mut outcome = StopOutcome::Killed;
        if !grace.is_zero()
            && self.qmp("system_powerdown", None).is_ok()
            && self.proc_.as_mut().is_some_and(|p| p.wait_exit(grace))
        {
            outcome = StopOutcome::Graceful;
        }
        if outcome != StopOutcome::Graceful {
            let _ = self.qmp.as_mut().map(|q| q.execute("quit", None));
            if let Some(p) = self.proc_.as_mut()
                && p.wait_exit(Duration::from_secs(5))
            {
                outcome = StopOutcome::Forced;
            }
        }
        self.kill_and_clean();
        Ok(outcome)
    }

    fn pause(&mut self) -> Result<()> {
        let next = self.check(Operation::Pause)?;
        self.qmp("stop", None)?;
        self.state = next;
        Ok(())
    }

    fn resume(&mut self) -> Result<()> {
        let next = self.check(Operation::Resume)?;
        self.qmp("cont", None)?;
        self.state = next;
        Ok(())
    }

    fn migrate(
        &mut self,
        target: &MigrationTarget,
        params: &MigrationParams,
    ) -> Result<MigrationReport> {
        self.migrate_out(target, params)
    }

    fn incoming(&self) -> Option<&MigrationTarget> {
        self.incoming.as_ref()
    }

    fn finish_incoming(&mut self, timeout: Duration) -> Result<()> {
        self.check(Operation::FinishIncoming)?;
        if self.incoming.is_none() {
            return Err(V2mError::InvalidTransition {
                vm: self.profile.name.to_string(),
                operation: Operation::FinishIncoming,
                from: self.state,
                allowed: "a destination prepared with prepare_incoming".into(),
            });
        }
        self.wait_incoming(timeout)
    }

    fn checkpoint(&mut self, path: &Path) -> Result<CheckpointReport> {
        self.save_to(path)
    }

    fn console_log(&self) -> Result<Vec<u8>> {
        match std::fs::read(&self.paths.console) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(V2mError::io("reading console log", &self.paths.console, e)),
        }
    }

    fn vcpu_threads(&mut self) -> Result<Vec<VcpuThread>> {
        self.check(Operation::VcpuThreads)?;
        let mut out = Vec::new();
        for (index, tid) in self.query_vcpus()? {
            let affinity = pin::get_affinity(tid).map_err(|e| {
                V2mError::io("reading affinity of thread", format!("/proc/{tid}"), e)
            })?;
            out.push(VcpuThread {
                index,
                thread_id: tid,
                affinity,
            });
        }
        Ok(out)
    }

    fn agent_socket(&self) -> Option<&Path> {
        self.proc_.as_ref().map(|_| self.paths.agent.as_path())
    }

    fn take_agent_channel(&mut self) -> Option<UnixStream> {
        self.agent_channel.take()
    }

    fn detach(mut self: Box<Self>) {
        self.owned = false;
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        if self.owned && self.proc_.is_some() {
            if let Some(q) = self.qmp.as_mut() {
                let _ = q.execute("quit", None);
            }
            if let Some(p) = self.proc_.as_mut()
                && !p.wait_exit(Duration::from_secs(2))
            {
                p.kill();
            }
            self.proc_ = None;
            self.clean_files();
        }
    }
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| V2mError::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| V2mError::io("renaming into place", path, e))
}
