//! Exit codes that batch scripts can rely on.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | success |
//! | 1    | internal error (a bug, or the host failed us: I/O, a hypervisor crashed) |
//! | 2    | invalid input (spec, policy, lock, arguments), or a system component is missing: fix it and retry |
//! | 3    | `vse lock --check`: the lockfile no longer matches spec, policies or repositories |
//!
//! A command that runs a user's job returns the job's own exit status instead.

use std::process::ExitCode;

/// Marks an error as the user's input being wrong (exit code 2).
#[derive(Debug)]
pub struct InvalidInput(pub String);

impl std::fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidInput {}

pub const INTERNAL: u8 = 1;
pub const INVALID_INPUT: u8 = 2;
pub const OUT_OF_DATE: u8 = 3;

/// A program of the host that vse needs is not installed: the user (or admin) can fix that,
/// so it is exit code 2, like bad input, never an internal error.
fn missing_component(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(v) = e.downcast_ref::<v2m::V2mError>() {
        return matches!(v, v2m::V2mError::BinaryNotFound { .. });
    }
    if let Some(imgbuild::disk::DiskError::Tool { source, .. }) = e.downcast_ref() {
        return source.kind() == std::io::ErrorKind::NotFound;
    }
    false
}

/// The user (or admin) can fix this: exit code 2.
pub fn is_invalid(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.is::<InvalidInput>() || missing_component(e))
}

/// Prints an error chain to stderr and picks the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    let invalid = is_invalid(err);
    eprintln!("error: {err}");
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    ExitCode::from(if invalid { INVALID_INPUT } else { INTERNAL })
}
