//! The helper's side: a fresh process of the calling binary (`<exe> build-in-userns`), single
//! threaded when it starts, that enters a user namespace of its own, waits for its parent to
//! write the maps, and builds the fetched packages as the namespace's root. Its stdout carries
//! only [`Msg`] lines; its stderr is the parent's.

use super::{Msg, Request};
use crate::progress::{Event, Progress};
use std::io::{BufRead, Write};
use std::sync::Mutex;

/// Runs the helper; returns its exit status (0: the parent got `Done`).
pub fn child_main(embedded_agent: Option<&'static [u8]>) -> i32 {
    let out = Mutex::new(std::io::stdout());
    let send = |m: &Msg| {
        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
        let line = serde_json::to_string(m).unwrap_or_default();
        let _ = writeln!(o, "{line}").and_then(|()| o.flush());
    };
    let fail = |message: String, kind| {
        send(&Msg::Failed { message, kind });
        1
    };
    if let Err(e) = enter() {
        return fail(
            format!(
                "cannot create the build's user namespace: {e}; hint: user namespaces must be enabled (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1 where it exists)"
            ),
            vse_exit::ErrorKind::MissingComponent,
        );
    }
    send(&Msg::Ready);
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
        // The parent could not map the ids and gave up: it reports why.
        return 1;
    }
    if let Err(e) = become_root() {
        return fail(
            format!("the build's user namespace is not usable: {e}"),
            vse_exit::ErrorKind::Internal,
        );
    }
    let req: Request = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                format!("bad request from the parent: {e}"),
                vse_exit::ErrorKind::Internal,
            );
        }
    };
    let mut opts = req.opts;
    opts.agent = match (req.agent, embedded_agent) {
        (super::Agent::File(p), _) => crate::build::AgentBinary::File(p),
        (super::Agent::Embedded, Some(bytes)) => crate::build::AgentBinary::Embedded(bytes),
        (super::Agent::Embedded, None) => {
            return fail(
                "the parent asked for the agent built into the binary, and this one has none"
                    .into(),
                vse_exit::ErrorKind::Internal,
            );
        }
    };
    let progress = Lines(&send);
    match crate::build::build_fetched(&req.plan, &opts, &req.debs, &progress) {
        Ok(outcome) => {
            send(&Msg::Done(Box::new(outcome)));
            0
        }
        Err(e) => {
            use vse_exit::Classify;
            fail(e.to_string(), e.kind())
        }
    }
}

/// Progress events as [`Msg::Event`] lines.
struct Lines<'a>(&'a (dyn Fn(&Msg) + Sync));

impl Progress for Lines<'_> {
    fn event(&self, ev: Event) {
        (self.0)(&Msg::Event(ev));
    }
}

/// Dies with the parent, then leaves the host's user namespace (only a single-threaded
/// process may).
fn enter() -> std::io::Result<()> {
    // SAFETY: prctl and unshare take no pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::unshare(libc::CLONE_NEWUSER) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Once mapped: the user's host id is the namespace's 0. The host's supplementary groups are
/// dropped (unmapped there, they would show as the overflow group).
fn become_root() -> std::io::Result<()> {
    // SAFETY: geteuid/getegid have no preconditions; setgroups with a zero count reads nothing.
    unsafe {
        if libc::geteuid() != 0 || libc::getegid() != 0 {
            return Err(std::io::Error::other(
                "the parent's maps do not make this process root in it",
            ));
        }
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
