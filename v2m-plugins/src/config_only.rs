//! Shared behaviour of the plugins that can only translate profiles on this kind of host (Xen,
//! Palacios): lifecycle calls report the probe's reason, never a pretended success.

use crate::error::{Result, V2mError};
use crate::plugin::{Availability, Vm};
use crate::state::Operation;

/// The error every lifecycle call returns: "not available here, because …" when the probe
/// failed, else "not implemented in this build" (typed `Unsupported`).
pub(crate) fn lifecycle(
    plugin: &'static str,
    probe: Availability,
    op: Operation,
) -> Result<Box<dyn Vm>> {
    Err(match probe {
        Availability::NotAvailable { reason } => V2mError::NotAvailable { plugin, reason },
        Availability::Available { .. } => V2mError::Unsupported {
            plugin,
            operation: op,
            reason: format!(
                "driving {plugin} VMs is not implemented in this build; use `vse vm explain` for the configuration"
            ),
        },
    })
}

pub(crate) fn unsupported(
    plugin: &'static str,
    op: Operation,
    reason: impl Into<String>,
) -> V2mError {
    V2mError::Unsupported {
        plugin,
        operation: op,
        reason: reason.into(),
    }
}

/// Rewrites the serial console of a QEMU-style command line for consoles that are not ttyS0.
pub(crate) fn with_console(cmdline: &str, console: &str) -> String {
    let mut parts: Vec<String> = cmdline
        .split_whitespace()
        .filter(|p| !p.starts_with("console="))
        .map(str::to_owned)
        .collect();
    parts.insert(0, format!("console={console}"));
    parts.join(" ")
}
