//! Commands that only print end as Unix tools do when their reader goes away
//! (`vse check … | head`): killed quietly by SIGPIPE, not panicking in `println!`. Rust
//! ignores SIGPIPE for every program; only a command without sockets or children to clean
//! up may take the default back (a front-end or agent must see EPIPE as an error instead).

/// Restores SIGPIPE's default action (terminate) for this process.
pub fn end_quietly_when_stdout_closes() {
    // SAFETY: signal(2) with SIG_DFL installs no handler code; it changes only the action of
    // SIGPIPE for this process, which the callers (printing commands) want.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
