//! The one error type of V2M. Every plugin maps its failures onto these variants so that callers
//! (launcher, CLI) can react by kind: an unsupported operation, a state-machine violation, a dead
//! hypervisor process and a busy migration port are different problems with different fixes.

use crate::state::{Operation, VmState};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum V2mError {
    #[error("{plugin} does not support {operation}: {reason}")]
    Unsupported {
        plugin: &'static str,
        operation: Operation,
        reason: String,
    },
    #[error("VM {vm}: cannot {operation} while {from} (allowed from: {allowed})")]
    InvalidTransition {
        vm: String,
        operation: Operation,
        from: VmState,
        allowed: String,
    },
    #[error("{plugin} is not available on this host: {reason}")]
    NotAvailable {
        plugin: &'static str,
        reason: String,
    },
    #[error("invalid profile{origin}: {field}: {message} (hint: {hint})")]
    InvalidProfile {
        /// " in FILE:LINE:COL" when the profile came from a file, else empty.
        origin: String,
        field: String,
        message: String,
        hint: String,
    },
    #[error("{binary} not found (hint: {hint})")]
    BinaryNotFound { binary: PathBuf, hint: String },
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("VM {vm}: hypervisor process exited unexpectedly ({status}){stderr}")]
    ProcessDied {
        vm: String,
        status: String,
        /// "; stderr: …" with the last lines QEMU wrote, or empty.
        stderr: String,
    },
    #[error("VM {vm}: QMP command {command} failed: {class}: {desc}")]
    Qmp {
        vm: String,
        command: String,
        class: String,
        desc: String,
    },
    #[error("VM {vm}: QMP protocol error: {message}")]
    QmpProtocol { vm: String, message: String },
    #[error(
        "migration destination {address} is already in use (hint: pick another port, or 0 for any)"
    )]
    PortInUse { address: String },
    #[error("VM {vm}: migration failed: {message}")]
    MigrationFailed { vm: String, message: String },
    #[error("VM {vm}: checkpoint/restore failed: {message}")]
    CheckpointFailed { vm: String, message: String },
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("disk overlay {path}: {message}")]
    Overlay { path: PathBuf, message: String },
    #[error(
        "no VM named {name} under {run_dir} (hint: `vse vm status` lists the VMs this host knows)"
    )]
    NotFound { name: String, run_dir: PathBuf },
    #[error("VM {name} already exists under {run_dir} (hint: stop it, or pick another name)")]
    AlreadyExists { name: String, run_dir: PathBuf },
    #[error("libvirt: {operation}: {message}")]
    Libvirt { operation: String, message: String },
    #[error("{0}")]
    Unsafe(#[from] vse_base::Unsafe),
    #[error("VM {vm}: cannot open the NIC's host end: {message}")]
    NetOpen { vm: String, message: String },
}

/// Requests that cannot be honoured (bad profile, wrong state, unknown or duplicate VM, busy
/// port, an operation the plugin lacks) are the caller's input; a hypervisor that is not
/// installed or not running is a missing component; the rest failed on the host.
impl vse_exit::Classify for V2mError {
    fn kind(&self) -> vse_exit::ErrorKind {
        use vse_exit::ErrorKind;
        match self {
            V2mError::InvalidProfile { .. }
            | V2mError::InvalidTransition { .. }
            | V2mError::NotFound { .. }
            | V2mError::AlreadyExists { .. }
            | V2mError::PortInUse { .. }
            | V2mError::Unsafe(_)
            | V2mError::Unsupported { .. } => ErrorKind::InvalidInput,
            V2mError::BinaryNotFound { .. } | V2mError::NotAvailable { .. } => {
                ErrorKind::MissingComponent
            }
            V2mError::Spawn { .. }
            | V2mError::ProcessDied { .. }
            | V2mError::Qmp { .. }
            | V2mError::QmpProtocol { .. }
            | V2mError::MigrationFailed { .. }
            | V2mError::CheckpointFailed { .. }
            | V2mError::Timeout { .. }
            | V2mError::Io { .. }
            | V2mError::Overlay { .. }
            | V2mError::Libvirt { .. }
            | V2mError::NetOpen { .. } => ErrorKind::Internal,
        }
    }
}

pub type Result<T, E = V2mError> = std::result::Result<T, E>;

impl V2mError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        V2mError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
