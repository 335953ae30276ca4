//! The node's VM service of one step (`vse spank node`), forked by slurmstepd as root before
//! the tasks start. It binds the step's socket at once (the tasks connect while the VM
//! boots), checks the request, boots the node's VM and runs each task's command through the
//! VM's guest agent, streaming the output back.
//!
//! Privileges: root never creates, opens or writes a path in a directory the user can write,
//! and QEMU always runs as the user. Everything root does comes first: the user's spec and
//! policies are read by a child running as the user and copied into the root-owned `input/`;
//! an image the user names is opened by a thread with the user's file-system ids and copied,
//! each part hashed against its manifest while copying, into a root-owned store; a spec is
//! built as root (its temporary files in the root-owned `tmp/`) into the node-local cache.
//! Root then joins the cgroups of the step's first task (see [`crate::cgroup`]), so the VM is
//! the job's for Slurm's limits, accounting and clean-up.
//! Only then does root create the empty `vm/` for the user and drop to the user for good;
//! the request is checked on root's copies, and QEMU, started after the drop, boots the
//! root-owned, read-only image on an overlay in `vm/`. Lifetime: the service ends when its
//! lifeline pipe closes (`slurm_spank_exit`, or slurmstepd dying); QEMU dies with it (V2M's
//! die-with-parent), and `vse spank stop` removes the step's directory.

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
use vse_guest_agent::share::server::ShareSet;
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
    /// The first of the step's tasks to connect: the service joins its cgroups.
    task: Mutex<Option<u32>>,
    task_seen: Condvar,
}

/// How long root waits for a task to connect before it would boot the VM outside the job's
/// cgroups. The tasks start right after the service and connect first thing.
const TASK_WAIT: Duration = Duration::from_secs(60);

impl Shared {
    fn first_task(&self, within: Duration) -> Option<u32> {
        let guard = self.task.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .task_seen
            .wait_timeout_while(guard, within, |t| t.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }
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
    prepare_dirs(&dir)?;
    // SAFETY: the process is still single-threaded: nothing reads the environment meanwhile.
    // Root's temporary files (a spec's build) go to its own `tmp/`; the VM's scratch goes to
    // the user's `vm/` by an explicit path, after the drop.
    unsafe {
        std::env::set_var("TMPDIR", dir.join("tmp"));
        if let Some(c) = &conf.cache {
            std::env::set_var("VSE_CACHE", c);
        }
    }
    log_to(&dir.join("node.log"))?;
    create_new(&dir.join(PID_FILE))
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes())
        })
        .map_err(SpankError::io("writing the pid file"))?;
    let sock = dir.join(SOCKET);
    let listener =
        UnixListener::bind(&sock).map_err(SpankError::io(format!("binding {}", sock.display())))?;
    std::os::unix::fs::lchown(&sock, Some(user.uid), Some(user.gid))
        .and_then(|_| std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)))
        .map_err(SpankError::io("securing the step socket"))?;
    if let Some(fd) = a.lifeline_fd {
        watch_lifeline(fd);
    }
    let shared = Arc::new(Shared {
        state: Mutex::new(State::Preparing),
        changed: Condvar::new(),
        dirs: Mutex::default(),
        task: Mutex::default(),
        task_seen: Condvar::new(),
    });
    let sh = shared.clone();
    let uid = user.uid;
    std::thread::spawn(move || accept(listener, sh, uid));
    // Booted on this thread, which lives as long as the process: QEMU's parent-death signal
    // follows the thread that started it.
    let audit = crate::audit::step_auditor(user.uid, &conf.site_policies);
    let (state, _vm) = match prepare(&a, &user, &dir, host, &audit, &shared) {
        Ok((link, vm)) => {
            let pid = Some(vm.pid());
            eprintln!("vse spank node: VM ready (kernel {})", link.kernel());
            (State::Ready { link, pid }, Some(vm))
        }
        Err((message, invalid)) => {
            eprintln!("vse spank node: {message}");
            if invalid {
                let entry = crate::audit::step_entry(&a);
                let refused = vse_audit::Entry {
                    outcome: vse_audit::Outcome::Refused,
                    rule: Some(message.clone()),
                    ..entry
                };
                if let Err(e) = audit.log(refused) {
                    eprintln!("vse spank node: {e}");
                }
            }
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
/// service's copies of the user's files) and `tmp/` (root's: temporary files of a build).
/// The step directory is made here, not found: a directory that exists after the stale one
/// was removed means someone else is racing for it.
fn prepare_dirs(dir: &Path) -> Result<(), SpankError> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(SpankError::io(format!("creating {}", parent.display())))?;
    root_only(parent)?;
    for (p, mode) in [
        (dir.to_path_buf(), 0o755),
        (dir.join("input"), 0o700),
        (dir.join("tmp"), 0o700),
    ] {
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(&p)
            .and_then(|_| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)))
            .map_err(SpankError::io(format!("creating {}", p.display())))?;
    }
    Ok(())
}

/// The run directory must be root's and writable by no one else: every step directory is
/// made in it by root.
fn root_only(dir: &Path) -> Result<(), SpankError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir)
        .map_err(SpankError::io(format!("checking {}", dir.display())))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(SpankError::Invalid(format!(
            "plugstack.conf: run_dir {} must be a directory owned by root and writable by no \
             one else",
            dir.display()
        )));
    }
    Ok(())
}

/// A file root makes in one of its own directories: a new one, never through a symlink.
fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The user's empty `vm/` in the root-owned step directory: scratch space and V2M's run
/// directory. Root creates it (the user cannot write the step directory) and hands it over
/// through the descriptor of the directory it made; root never looks inside it again.
fn user_dir(dir: &Path, user: &JobUser) -> Result<PathBuf, SpankError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let vm = dir.join("vm");
    let fail = SpankError::io(format!("handing {} to the job user", vm.display()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&vm)
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&vm)
        })
        .and_then(|d| {
            // SAFETY: `d` is an open directory; plain integers.
            if unsafe { libc::fchown(d.as_raw_fd(), user.uid, user.gid) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .map_err(fail)?;
    Ok(vm)
}

/// The service's own diagnostics (and what the build prints) go to the step's log.
fn log_to(path: &Path) -> Result<(), SpankError> {
    use std::os::fd::AsRawFd;
    let f = create_new(path).map_err(SpankError::io("creating the log"))?;
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
    host: &dyn Host,
    audit: &vse_audit::Auditor,
    shared: &Shared,
) -> Result<Prepared, (String, bool)> {
    let spank = |e: SpankError| (e.to_string(), e.is_invalid());
    let host_err = |e: HostError| (e.message, e.invalid);
    let input = dir.join("input");
    let (checked, image) = if is_spec_name(&a.request.image) {
        let staged = stage_user_files(&a.request, user, &input, true).map_err(spank)?;
        let checked = request::check(&staged).map_err(spank)?;
        refuse_spec_under_signed_by(&checked, &a.request.image).map_err(spank)?;
        let request::Source::Spec(spec) = &checked.source else {
            return Err(("the staged spec is not a spec".into(), false));
        };
        let image = host
            .image_for_spec(spec, &checked.policies)
            .map_err(host_err)?;
        (checked, image)
    } else {
        let mut staged = stage_user_files(&a.request, user, &input, false).map_err(spank)?;
        user_keyrings_are_root_s(&staged).map_err(spank)?;
        let copy = admitted_copy(&a.request, user).map_err(spank)?;
        staged.image = copy.display().to_string();
        // The user named their directory, not the node's copy of it.
        let named = a.request.cwd.join(a.request.image.trim());
        let checked = request::check(&staged).map_err(|e| {
            let msg = e.to_string().replace(
                &format!("--vse={}: {}", copy.display(), copy.display()),
                &format!(
                    "--vse={}: {} (the node's copy)",
                    a.request.image.trim(),
                    named.display()
                ),
            );
            (msg, e.is_invalid())
        })?;
        (checked, copy)
    };
    // Still root: the store of admitted copies and built images is root's.
    let limits = vsec::merge::limits(&checked.rules).cache();
    if let Some(store) = vse_base::cache::image_store_of(&image) {
        for line in vse_base::evict::keep(&[&store], &image, &limits) {
            eprintln!("vse node service: {line}");
        }
    }
    // Root is done: the job's cgroups, the user's scratch directory, then the user for good.
    let task = shared.first_task(TASK_WAIT).ok_or_else(|| {
        (
            format!(
                "no task of the step connected within {TASK_WAIT:?}: the VM would run outside the job's cgroups"
            ),
            false,
        )
    })?;
    let joined = crate::cgroup::join_task(task).map_err(spank)?;
    for d in &joined {
        eprintln!("vse spank node: joined the job's cgroup {}", d.display());
    }
    let vm_dir = user_dir(dir, user).map_err(spank)?;
    user.become_user().map_err(spank)?;
    let (vcpus, memory_mib) = checked.vm_size(a.tasks, a.cpus_per_task);
    let shares = step_shares(&checked, &a.request.cwd).map_err(spank)?;
    eprintln!(
        "vse spank node: booting {} with {vcpus} vCPU(s) and {memory_mib} MiB",
        image.display()
    );
    let size = (vcpus, memory_mib);
    // Part of the admission: a VM the job's memory cannot hold is refused, and recorded so.
    vmhost::fit::check(memory_mib, 1).map_err(|e| (format!("booting the VM: {e}"), true))?;
    let mut entry = crate::audit::step_entry(a);
    entry.image = vse_audit::image_digest(&image);
    audit.log(entry).map_err(|e| (e.to_string(), false))?;
    let vm = boot(&image, size, &vm_dir, checked.conf.accel, shares)?;
    vm.link()
        .mount_shares(BOOT_TIMEOUT)
        .map_err(|e| (e.to_string(), false))?;
    Ok((vm.link().clone(), vm))
}

/// The step's shares, resolved and opened as the job's user (this process is by now), from
/// the directory srun ran in.
fn step_shares(checked: &Checked, cwd: &Path) -> Result<Option<Arc<ShareSet>>, SpankError> {
    let home = vse_guest_agent::protocol::GuestUser::current().home;
    let resolved = crate::shares::resolve(&checked.shares, cwd, Path::new(&home))?;
    Ok(Some(Arc::new(crate::shares::open(resolved)?)))
}

/// Root reads the keyrings a user's policy names in `images.signed_by` (narrowing the site's
/// requirement is the user's right), so each must be a root-owned file no one else can
/// replace: a user cannot point root at a file of theirs, a FIFO or a device.
fn user_keyrings_are_root_s(staged: &RequestArgs) -> Result<(), SpankError> {
    let policies = staged.policies.iter().flat_map(|p| p.split(','));
    for p in policies.filter(|p| !p.is_empty()) {
        let pol =
            vsec::policy::load(Path::new(p)).map_err(|e| SpankError::Invalid(e.to_string()))?;
        for rule in &pol.images.signed_by {
            for k in &rule.value {
                if let Err(why) = root_file(Path::new(k.as_str())) {
                    return Err(SpankError::Invalid(format!(
                        "{}: --vse-policy: images.signed_by keyring {k}: {why}; hint: name a \
                         keyring of the site's (root-owned, e.g. under /etc)",
                        rule.at
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `p` is a regular file of root's, reached through directories only root can change (or
/// sticky ones).
fn root_file(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).map_err(|e| e.to_string())?;
    if !m.is_file() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err("not a regular file owned by root and writable by root only".into());
    }
    for a in p.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
        let m = std::fs::symlink_metadata(a).map_err(|e| e.to_string())?;
        let writable = m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0;
        if !m.is_dir() || m.uid() != 0 || writable {
            return Err(format!(
                "{} is not a directory of root's that only root can change",
                a.display()
            ));
        }
    }
    Ok(())
}

/// A spec is built here, unsigned: a stack that demands signed images refuses it.
fn refuse_spec_under_signed_by(checked: &Checked, named: &str) -> Result<(), SpankError> {
    match checked.rules.images.signed_by.first() {
        Some(rule) => Err(SpankError::Invalid(format!(
            "--vse={}: {}: the site requires signed images (images.signed_by), and an image \
             the node builds from a spec is unsigned; hint: have the site's build service \
             build and sign the image (`vse build`, `vse sign`) and pass --vse=IMAGE",
            named.trim(),
            rule.at
        ))),
        None => Ok(()),
    }
}

/// The image the user named, opened with the user's rights and copied from those
/// descriptors into the root-owned store (`$VSE_CACHE/admitted`), every part checked against
/// the manifest while copying. The request is then checked (signature, rules) on the copy,
/// and the copy is what boots: nothing the user changes in the original afterwards matters.
fn admitted_copy(r: &RequestArgs, user: &JobUser) -> Result<PathBuf, SpankError> {
    let value = r.image.trim();
    let named = r.cwd.join(value);
    let invalid = |e: vsec::admit::AdmitError| SpankError::Invalid(format!("--vse={value}: {e}"));
    let admitted = user
        .as_user(|| vsec::admit::Admitted::open(&named))?
        .map_err(invalid)?;
    let store = vse_base::cache_root().join("admitted");
    admitted
        .publish(&store, vsec::admit::Readers::Anyone)
        .map_err(invalid)
}

/// Boots `image` on a throw-away overlay; QEMU dies with this process.
fn boot(
    image: &Path,
    (vcpus, memory_mib): (u32, u64),
    vm_dir: &Path,
    accel: Accel,
    shares: Option<Arc<ShareSet>>,
) -> Result<RunningVm, (String, bool)> {
    let run_dir = vm_dir.join("v2m");
    let image = ImageDir::open(image).map_err(|e| (e.to_string(), false))?;
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
        .map_err(|e| (format!("{e}"), false))?;
    let spec = VmSpec::new(&image, name, vcpus, memory_mib);
    let mut opts = BootOptions::new("spank", BOOT_TIMEOUT);
    opts.scratch_parent = Some(vm_dir.to_path_buf());
    opts.agent = opts.agent.shares(shares);
    vmhost::boot(&QemuPlugin::new(cfg), &spec, &opts).map_err(|e| {
        // Larger than the job's memory: the user's request (`--vse-memory`, `--mem`) to fix.
        let invalid = matches!(e, vmhost::BootError::TooLarge(_));
        (format!("booting the VM: {e}"), invalid)
    })
}

fn is_spec_name(s: &str) -> bool {
    s.ends_with(".yaml") || s.ends_with(".yml")
}

/// Copies the spec (`with_spec`) and the user's policies, read as the user, into `input`
/// (root's) and returns the request pointing at the copies.
fn stage_user_files(
    r: &RequestArgs,
    user: &JobUser,
    input: &Path,
    with_spec: bool,
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
    let mut files = Vec::new();
    if with_spec {
        files.push(spec.clone());
    }
    files.extend(policies.iter().cloned());
    let texts = if files.is_empty() {
        Vec::new()
    } else {
        let exe = std::env::current_exe().map_err(SpankError::io("finding the vse binary"))?;
        user.read_files(&exe, &files)?
    };
    let name = |p: &Path, i: usize| {
        let base = p.file_name().map(|n| n.to_string_lossy().replace(',', "_"));
        format!("{i}-{}", base.unwrap_or_default())
    };
    let mut staged = Vec::new();
    for (i, (p, text)) in files.iter().zip(&texts).enumerate() {
        let to = input.join(name(p, i));
        create_new(&to)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
            .map_err(SpankError::io(format!("writing {}", to.display())))?;
        staged.push(to);
    }
    let pols: Vec<String> = staged[usize::from(with_spec)..]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    Ok(RequestArgs {
        image: if with_spec {
            staged[0].display().to_string()
        } else {
            spec.display().to_string()
        },
        policies: (!pols.is_empty()).then(|| pols.join(",")),
        cwd: input.to_path_buf(),
        ..r.clone()
    })
}

fn accept(listener: UnixListener, shared: Arc<Shared>, uid: u32) {
    for conn in listener.incoming().flatten() {
        if let Some(c) = peer_cred(&conn)
            && c.uid == uid
        {
            let mut t = shared.task.lock().unwrap_or_else(|e| e.into_inner());
            if t.is_none() {
                *t = u32::try_from(c.pid).ok();
                shared.task_seen.notify_all();
            }
        }
        let sh = shared.clone();
        std::thread::spawn(move || handle(conn, &sh, uid));
    }
}

fn peer_uid(s: &UnixStream) -> Option<u32> {
    peer_cred(s).map(|c| c.uid)
}

fn peer_cred(s: &UnixStream) -> Option<libc::ucred> {
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
    (rc == 0).then_some(cred)
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
    // After the request, the rest of what the task sends is its standard input.
    let Ok(mut input) = conn.try_clone().map(BufReader::new) else {
        return fail("cannot read the task's connection".into(), false);
    };
    let req: ExecRequest = match proto::recv(&mut input, MAX_REQUEST) {
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
    let user = vse_guest_agent::protocol::GuestUser::current();
    let pending = link.spawn_stream_with_input(&argv, env, user, Some(cwd), input);
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

/// The task's directory when the guest has it, else the user's home there: host directories
/// are not shared with the VM, and a command must not fail only because its submit directory
/// is missing.
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
    let d = if has {
        want.to_string()
    } else {
        vse_guest_agent::protocol::GuestUser::current().home
    };
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
