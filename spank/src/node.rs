//! The node's VM service of one step (`vse spank node`), forked by slurmstepd as root before
//! the tasks start. It binds the step's socket at once (the tasks connect while the VM
//! boots), checks the request, boots the node's VM and runs each task's command through the
//! VM's guest agent, streaming the output back.
//!
//! Privileges: a spec and the user's policies are read as the user (a child process) and the
//! spec is built from the service's own copies, as root, into the node-local cache; an image
//! the user names is read only after the service has dropped to the user for good, so QEMU
//! then runs as the user too. Lifetime: the service ends when its lifeline pipe closes
//! (`slurm_spank_exit`, or slurmstepd dying); QEMU dies with it (V2M's die-with-parent), and
//! `vse spank stop` removes the step's directory.

use crate::proto::{self, ExecRequest, MAX_REQUEST, PID_FILE, Reply, SOCKET};
use crate::request::{self, Accel, Checked, PluginConf};
use crate::user::JobUser;
use crate::{NodeArgs, RequestArgs, SpankError};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Read};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use vmhost::{BootOptions, RunningVm, VmSpec};
use vse_guest_agent::GuestLink;
use vse_image::ImageDir;

/// How long the guest agent may take to come up (TCG boots are slow on a loaded node).
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// A failure of the binary's side (boot, build); `invalid`: the user's input was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HostError {
    pub message: String,
    pub invalid: bool,
}

/// What the binary provides: building lives there (with `vse build`), and this service calls
/// it rather than copying it.
pub trait Host {
    /// The image of `spec` under `policies` (site first), built into the node-local cache
    /// (`VSE_CACHE`) unless it is there already.
    fn image_for_spec(&self, spec: &Path, policies: &[PathBuf]) -> Result<PathBuf, HostError>;
}

enum State {
    Preparing,
    Ready {
        link: Arc<GuestLink>,
        pid: Option<u32>,
    },
    Failed {
        message: String,
        invalid: bool,
    },
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Task directories the guest has (or lacks), probed once each.
    dirs: Mutex<HashMap<String, String>>,
}

/// Runs the service until the lifeline closes. Returns only on a set-up error.
pub fn serve(a: NodeArgs, host: &dyn Host) -> Result<(), SpankError> {
    let conf = PluginConf::parse(&a.request.plugin_args)?;
    let user = JobUser::new(a.uid, a.gid, &a.groups)?;
    let dir = step_dir(&conf, &a.dir)?;
    // Files of an earlier step with the same ids (job ids restart with a fresh slurmctld).
    // Nothing is killed here: this step's tasks, which name the directory too, may already run.
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(SpankError::io(format!(
                "removing the stale {}",
                dir.display()
            ))(e));
        }
        _ => {}
    }
    let vm_dir = prepare_dirs(&dir, &user)?;
    // SAFETY: the process is still single-threaded: nothing reads the environment meanwhile.
    unsafe {
        std::env::set_var("TMPDIR", &vm_dir);
        if let Some(c) = &conf.cache {
            std::env::set_var("VSE_CACHE", c);
        }
    }
    log_to(&dir.join("node.log"))?;
    std::fs::write(dir.join(PID_FILE), std::process::id().to_string())
        .map_err(SpankError::io("writing the pid file"))?;
    let sock = dir.join(SOCKET);
    let listener =
        UnixListener::bind(&sock).map_err(SpankError::io(format!("binding {}", sock.display())))?;
    std::os::unix::fs::chown(&sock, Some(user.uid), Some(user.gid))
        .and_then(|_| std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)))
        .map_err(SpankError::io("securing the step socket"))?;
    if let Some(fd) = a.lifeline_fd {
        watch_lifeline(fd);
    }
    let shared = Arc::new(Shared {
        state: Mutex::new(State::Preparing),
        changed: Condvar::new(),
        dirs: Mutex::default(),
    });
    let sh = shared.clone();
    let uid = user.uid;
    std::thread::spawn(move || accept(listener, sh, uid));
    // Booted on this thread, which lives as long as the process: QEMU's parent-death signal
    // follows the thread that started it.
    let (state, _vm) = match prepare(&a, &user, &dir, &vm_dir, host) {
        Ok((link, vm)) => {
            let pid = Some(vm.pid());
            eprintln!("vse spank node: VM ready (kernel {})", link.kernel());
            (State::Ready { link, pid }, Some(vm))
        }
        Err((message, invalid)) => {
            eprintln!("vse spank node: {message}");
            (State::Failed { message, invalid }, None)
        }
    };
    *shared.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
    shared.changed.notify_all();
    loop {
        std::thread::park();
    }
}

/// The step directory must be a `<job>.<step>.<node>` entry of the configured run directory.
pub(crate) fn step_dir(conf: &PluginConf, dir: &Path) -> Result<PathBuf, SpankError> {
    if dir.parent() != Some(conf.run_dir.as_path()) || !crate::stop::is_step_name(dir) {
        return Err(SpankError::Invalid(format!(
            "--dir {}: expected <job>.<step>.<node> inside run_dir {}",
            dir.display(),
            conf.run_dir.display()
        )));
    }
    Ok(dir.to_path_buf())
}

/// `dir` (root's, 0755: the tasks reach the socket in it) with `input/` (root's: the
/// service's copies of the user's files) and `vm/` (the user's: scratch space and V2M's run
/// directory, used after the service may have dropped to the user).
fn prepare_dirs(dir: &Path, user: &JobUser) -> Result<PathBuf, SpankError> {
    use std::os::unix::fs::DirBuilderExt;
    let mk = |p: &Path, mode: u32| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(p)
            .and_then(|_| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)))
            .map_err(SpankError::io(format!("creating {}", p.display())))
    };
    mk(dir, 0o755)?;
    mk(&dir.join("input"), 0o700)?;
    let vm = dir.join("vm");
    mk(&vm, 0o700)?;
    std::os::unix::fs::chown(&vm, Some(user.uid), Some(user.gid)).map_err(SpankError::io(
        format!("handing {} to the job user", vm.display()),
    ))?;
    Ok(vm)
}

/// The service's own diagnostics (and what the build prints) go to the step's log.
fn log_to(path: &Path) -> Result<(), SpankError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::create(path).map_err(SpankError::io("creating the log"))?;
    // SAFETY: both descriptors are valid; fd 2 is ours to replace.
    if unsafe { libc::dup2(f.as_raw_fd(), 2) } < 0 {
        return Err(SpankError::io("redirecting stderr")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn watch_lifeline(fd: i32) {
    // SAFETY: the shim passes the read end of the lifeline pipe as this descriptor, and
    // nothing else in this process uses it.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
        eprintln!("vse spank node: the step is over");
        // The VM goes with this process (QEMU's parent-death signal); `vse spank stop`
        // removes the directory.
        std::process::exit(0);
    });
}

type Prepared = (Arc<GuestLink>, RunningVm);

fn prepare(
    a: &NodeArgs,
    user: &JobUser,
    dir: &Path,
    vm_dir: &Path,
    host: &dyn Host,
) -> Result<Prepared, (String, bool)> {
    let spank = |e: SpankError| (e.to_string(), e.is_invalid());
    let host_err = |e: HostError| (e.message, e.invalid);
    let checked: Checked = if is_spec_name(&a.request.image) {
        let staged = stage_user_files(&a.request, user, &dir.join("input")).map_err(spank)?;
        request::check(&staged).map_err(spank)?
    } else {
        user.become_user().map_err(spank)?;
        request::check(&a.request).map_err(spank)?
    };
    let (vcpus, memory_mib) = checked.vm_size(a.tasks, a.cpus_per_task);
    let image = match &checked.source {
        request::Source::Image(p) => p.clone(),
        request::Source::Spec(s) => host
            .image_for_spec(s, &checked.policies)
            .map_err(host_err)?,
    };
    eprintln!(
        "vse spank node: booting {} with {vcpus} vCPU(s) and {memory_mib} MiB",
        image.display()
    );
    let vm = boot(
        &image,
        vcpus,
        memory_mib,
        &vm_dir.join("v2m"),
        checked.conf.accel,
    )
    .map_err(|e| (e, false))?;
    Ok((vm.link().clone(), vm))
}

/// Boots `image` on a throw-away overlay; QEMU dies with this process.
fn boot(
    image: &Path,
    vcpus: u32,
    memory_mib: u64,
    run_dir: &Path,
    accel: Accel,
) -> Result<RunningVm, String> {
    let image = ImageDir::open(image).map_err(|e| e.to_string())?;
    let cfg = QemuConfig {
        run_root: run_dir.to_path_buf(),
        accel: match accel {
            Accel::Auto => AccelPolicy::Auto,
            Accel::Kvm => AccelPolicy::Kvm,
            Accel::Tcg => AccelPolicy::Tcg,
        },
        die_with_parent: true,
        ephemeral: true,
        ..QemuConfig::default()
    };
    let name = format!("spank-{}", std::process::id())
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = VmSpec::new(&image, name, vcpus, memory_mib);
    vmhost::boot(
        &QemuPlugin::new(cfg),
        &spec,
        &BootOptions::new("spank", BOOT_TIMEOUT),
    )
    .map_err(|e| format!("booting the VM: {e}"))
}

fn is_spec_name(s: &str) -> bool {
    s.ends_with(".yaml") || s.ends_with(".yml")
}

/// Copies the spec and the user's policies, read as the user, into `input` (root's) and
/// returns the request pointing at the copies.
fn stage_user_files(
    r: &RequestArgs,
    user: &JobUser,
    input: &Path,
) -> Result<RequestArgs, SpankError> {
    let spec = r.cwd.join(&r.image);
    let policies: Vec<PathBuf> = r
        .policies
        .iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| r.cwd.join(p))
        .collect();
    let mut files = vec![spec.clone()];
    files.extend(policies.iter().cloned());
    let exe = std::env::current_exe().map_err(SpankError::io("finding the vse binary"))?;
    let texts = user.read_files(&exe, &files)?;
    let name = |p: &Path, i: usize| {
        let base = p.file_name().map(|n| n.to_string_lossy().replace(',', "_"));
        format!("{i}-{}", base.unwrap_or_default())
    };
    let mut staged = Vec::new();
    for (i, (p, text)) in files.iter().zip(&texts).enumerate() {
        let to = input.join(name(p, i));
        std::fs::write(&to, text).map_err(SpankError::io(format!("writing {}", to.display())))?;
        staged.push(to);
    }
    let pols: Vec<String> = staged[1..]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    Ok(RequestArgs {
        image: staged[0].display().to_string(),
        policies: (!pols.is_empty()).then(|| pols.join(",")),
        cwd: input.to_path_buf(),
        ..r.clone()
    })
}

fn accept(listener: UnixListener, shared: Arc<Shared>, uid: u32) {
    for conn in listener.incoming().flatten() {
        let sh = shared.clone();
        std::thread::spawn(move || handle(conn, &sh, uid));
    }
}

fn peer_uid(s: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

fn handle(conn: UnixStream, shared: &Shared, uid: u32) {
    let fail = |message: String, invalid| {
        let _ = proto::send(&conn, &Reply::Failed { message, invalid });
    };
    if !matches!(peer_uid(&conn), Some(p) if p == uid || p == 0) {
        return fail(
            "only the step's user may run commands in its VM".into(),
            true,
        );
    }
    let req: ExecRequest = match proto::recv(&mut BufReader::new(&conn), MAX_REQUEST) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => return fail(format!("bad request: {e}"), true),
    };
    if req.argv.is_empty() {
        return fail("no command to run".into(), true);
    }
    let (link, pid) = {
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while matches!(*st, State::Preparing) {
            st = shared.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &*st {
            State::Ready { link, pid } => (link.clone(), *pid),
            State::Failed { message, invalid } => return fail(message.clone(), *invalid),
            State::Preparing => return,
        }
    };
    let cwd = guest_dir(&link, shared, &req.cwd);
    let mut env = req.env;
    env.insert("PWD".into(), cwd.clone());
    let argv: Vec<&str> = req.argv.iter().map(String::as_str).collect();
    let pending = link.spawn_stream_in(&argv, env, &cwd);
    let mut out = |stream, data: &str| {
        let _ = proto::send(
            &conn,
            &Reply::Output {
                stream,
                data: data.to_string(),
            },
        );
    };
    loop {
        match pending.poll(Duration::from_millis(500), &mut out) {
            Ok(Some(o)) => {
                // An agent without streaming sends the whole output at the end.
                use vse_guest_agent::protocol::OutStream;
                for (s, d) in [
                    (OutStream::Stdout, &o.stdout),
                    (OutStream::Stderr, &o.stderr),
                ] {
                    if !d.is_empty() {
                        out(s, d);
                    }
                }
                let _ = proto::send(&conn, &Reply::Exited { status: o.status });
                return;
            }
            Ok(None) if pid.is_some_and(|p| !alive(p)) => {
                return fail("the VM's hypervisor exited".into(), false);
            }
            Ok(None) => {}
            Err(e) => return fail(format!("running {:?} in the VM: {e}", req.argv), false),
        }
    }
}

/// The task's directory when the guest has it, else `/`: host directories are not shared
/// with the VM, and a command must not fail only because its submit directory is missing.
fn guest_dir(link: &GuestLink, shared: &Shared, want: &str) -> String {
    let mut known = shared.dirs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = known.get(want) {
        return d.clone();
    }
    let path = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
    let has = link
        .spawn(&["test", "-d", want], path)
        .wait(Duration::from_secs(60))
        .is_ok_and(|o| o.status == 0);
    let d = if has { want.to_string() } else { "/".into() };
    known.insert(want.to_string(), d.clone());
    d
}

/// A process that exists and is not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}
