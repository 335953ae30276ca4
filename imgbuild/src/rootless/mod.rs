//! Builds as an ordinary user, as `mmdebstrap --mode=unshare` and podman do: once the
//! packages are fetched, a helper process (this binary again, [`CHILD_COMMAND`]) enters a
//! user namespace whose id 0 is the user and whose ids 1..65535 are the user's subordinate
//! ids (`/etc/subuid`, `/etc/subgid`, mapped by the setuid `newuidmap` and `newgidmap`).
//! Inside, the build is the root build: packages unpack with their owners, maintainer
//! scripts chown to system users in a sandbox nested with the same ids, and the disk writer
//! reads the image's own ids from the tree, so the image is byte-identical to a root build of
//! the same lock. Nothing runs with a privilege the user does not have on the host.
//!
//! The unpacked tree holds files of subordinate ids, which the user can remove only from
//! inside such a namespace: the helper removes its scratch directory itself (and the next
//! rootless build sweeps one a killed build left), and keeps no layers.

mod child;
pub mod subid;

pub use child::child_main;

use crate::build::{AgentBinary, BuildOptions, BuildOutcome};
use crate::deb::DebFile;
use crate::plan::BuildPlan;
use crate::progress::{Event, Progress};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use subid::{NEEDED, SubIdError, SubRange};

/// The hidden subcommand a binary using rootless builds dispatches to [`child_main`].
pub const CHILD_COMMAND: &str = "build-in-userns";

#[derive(Debug, thiserror::Error)]
pub enum RootlessError {
    #[error(transparent)]
    SubIds(#[from] SubIdError),
    #[error(
        "{tool} could not run: {source}; hint: an admin installs newuidmap and newgidmap (Debian package uidmap), setuid root as packaged"
    )]
    Tool {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error(
        "{tool} refused to map the subordinate ids ({status}): {stderr}; hint: an admin checks that {tool} is setuid root and that /etc/subuid and /etc/subgid give this user the range"
    )]
    Map {
        tool: &'static str,
        status: String,
        stderr: String,
    },
    #[error("the rootless build helper ({exe} {CHILD_COMMAND}) {what}")]
    Helper { exe: String, what: String },
    /// The build inside the namespace failed: its own message and kind.
    #[error("{message}")]
    Build {
        message: String,
        kind: vse_exit::ErrorKind,
    },
}

impl vse_exit::Classify for RootlessError {
    fn kind(&self) -> vse_exit::ErrorKind {
        use vse_exit::ErrorKind;
        match self {
            RootlessError::SubIds(e) => e.kind(),
            RootlessError::Tool { .. } | RootlessError::Map { .. } => ErrorKind::MissingComponent,
            RootlessError::Helper { .. } => ErrorKind::Internal,
            RootlessError::Build { kind, .. } => *kind,
        }
    }
}

/// What the parent sends once the maps are written.
#[derive(serde::Serialize, serde::Deserialize)]
struct Request {
    plan: BuildPlan,
    /// Everything but the agent, which travels as [`Agent`].
    opts: BuildOptions,
    agent: Agent,
    debs: Vec<DebFile>,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum Agent {
    File(PathBuf),
    /// The helper's own (the same executable as the parent's).
    Embedded,
}

/// A line of the helper's stdout.
#[derive(serde::Serialize, serde::Deserialize)]
enum Msg {
    Ready,
    Event(Event),
    Done(Box<BuildOutcome>),
    Failed {
        message: String,
        kind: vse_exit::ErrorKind,
    },
}

/// Whether this process builds through the helper: it is not root on the host.
pub fn needed() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() != 0 }
}

/// The user's ranges, checked before any work is done (so a user without them learns it
/// before the download).
pub fn ranges() -> Result<(SubRange, SubRange), SubIdError> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let name = vse_base::account::passwd(uid).map_or_else(|| uid.to_string(), |p| p.name);
    let read = |p| std::fs::read_to_string(p).unwrap_or_default();
    let u = subid::find("/etc/subuid", &read("/etc/subuid"), &name, uid)?;
    let g = subid::find("/etc/subgid", &read("/etc/subgid"), &name, uid)?;
    Ok((u, g))
}

/// Builds `plan` from its fetched `debs` in the helper; its progress comes back as events.
pub fn build_in_userns(
    plan: &BuildPlan,
    opts: &BuildOptions,
    debs: &[DebFile],
    progress: &dyn Progress,
) -> Result<BuildOutcome, RootlessError> {
    let (sub_u, sub_g) = ranges()?;
    let exe = "/proc/self/exe";
    let helper = |what: String| RootlessError::Helper {
        exe: exe.into(),
        what,
    };
    let mut child = Command::new(exe)
        .arg(CHILD_COMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| helper(format!("could not start: {e}")))?;
    let guard = KillOnDrop(&mut child);
    let mut lines = BufReader::new(guard.0.stdout.take().expect("piped")).lines();
    let mut next = || -> Result<Option<Msg>, RootlessError> {
        match lines.next() {
            None => Ok(None),
            Some(l) => {
                let l = l.map_err(|e| helper(format!("could not be read: {e}")))?;
                serde_json::from_str(&l)
                    .map(Some)
                    .map_err(|e| helper(format!("wrote {l:?}: {e}")))
            }
        }
    };
    match next()? {
        Some(Msg::Ready) => {}
        Some(Msg::Failed { message, kind }) => return Err(RootlessError::Build { message, kind }),
        _ => return Err(helper("ended before its user namespace was made".into())),
    }
    let pid = guard.0.id();
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    map("newuidmap", pid, uid, sub_u)?;
    map("newgidmap", pid, gid, sub_g)?;
    let mut opts = opts.clone();
    // Layers would hold subordinate-id files outside any namespace's reach.
    opts.layer_cache = None;
    let agent = match &opts.agent {
        AgentBinary::File(p) => Agent::File(p.clone()),
        AgentBinary::Embedded(_) => Agent::Embedded,
    };
    let req = Request {
        plan: plan.clone(),
        opts,
        agent,
        debs: debs.to_vec(),
    };
    let mut stdin = guard.0.stdin.take().expect("piped");
    let line = serde_json::to_string(&req).map_err(|e| helper(format!("request: {e}")))?;
    writeln!(stdin, "{line}").map_err(|e| helper(format!("did not take its request: {e}")))?;
    drop(stdin);
    let mut result = None;
    while let Some(m) = next()? {
        match m {
            Msg::Event(ev) => progress.event(ev),
            Msg::Done(outcome) => result = Some(Ok(*outcome)),
            Msg::Failed { message, kind } => {
                result = Some(Err(RootlessError::Build { message, kind }));
            }
            Msg::Ready => {}
        }
    }
    // Reaped here, the guard's kill is a no-op.
    let status = guard.0.wait().map_err(|e| helper(format!("wait: {e}")))?;
    result.unwrap_or_else(|| Err(helper(format!("died ({status}) before it finished"))))
}

/// `newuidmap PID 0 ID 1 1 FIRST 65535` (or the gid map): the user is 0, its range the rest.
fn map(tool: &'static str, pid: u32, own: u32, sub: SubRange) -> Result<(), RootlessError> {
    let o = Command::new(tool)
        .args([pid, 0, own, 1, 1, sub.first, NEEDED].map(|n| n.to_string()))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RootlessError::Tool { tool, source })?;
    if !o.status.success() {
        return Err(RootlessError::Map {
            tool,
            status: o.status.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Kills and reaps the helper on every early return (its own children die with it).
struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
