//! Choosing a backend at run time: every compiled-in plugin is probed, and the first available
//! one in preference order (QEMU, libvirt, Xen, Palacios) wins unless the caller names one.

use crate::error::{Result, V2mError};
use crate::plugin::{Availability, Plugin, PluginKind};

/// Settings shared by the plugins that need them.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    #[cfg(feature = "qemu")]
    pub qemu: crate::qemu::QemuConfig,
    #[cfg(feature = "libvirt")]
    pub libvirt: crate::libvirt::LibvirtConfig,
}

/// All plugins compiled into this build, in preference order.
// One push per compiled-in feature, so the list cannot be a vec![] literal.
#[allow(clippy::vec_init_then_push)]
pub fn all(settings: &Settings) -> Vec<Box<dyn Plugin>> {
    let _ = settings;
    #[allow(unused_mut)]
    let mut v: Vec<Box<dyn Plugin>> = Vec::new();
    #[cfg(feature = "qemu")]
    v.push(Box::new(crate::qemu::QemuPlugin::new(
        settings.qemu.clone(),
    )));
    #[cfg(feature = "libvirt")]
    v.push(Box::new(crate::libvirt::LibvirtPlugin::new(
        settings.libvirt.clone(),
    )));
    #[cfg(feature = "xen")]
    v.push(Box::new(crate::xen::XenPlugin::default()));
    #[cfg(feature = "palacios")]
    v.push(Box::new(crate::palacios::PalaciosPlugin));
    v
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeResult {
    pub plugin: PluginKind,
    pub availability: Availability,
}

pub fn probe_all(settings: &Settings) -> Vec<ProbeResult> {
    all(settings)
        .iter()
        .map(|p| ProbeResult {
            plugin: p.kind(),
            availability: p.probe(),
        })
        .collect()
}

/// The named plugin (must be compiled in and available), or the first available one.
pub fn select(settings: &Settings, wanted: Option<PluginKind>) -> Result<Box<dyn Plugin>> {
    let plugins = all(settings);
    let mut reasons = Vec::new();
    for p in plugins {
        if wanted.is_some_and(|w| w != p.kind()) {
            continue;
        }
        match p.probe() {
            Availability::Available { .. } => return Ok(p),
            Availability::NotAvailable { reason } => {
                reasons.push(format!("{}: {reason}", p.kind()))
            }
        }
    }
    let plugin: &'static str = wanted.map_or("any plugin", PluginKind::as_str);
    Err(V2mError::NotAvailable {
        plugin,
        reason: if reasons.is_empty() {
            "not compiled into this build (cargo feature disabled)".into()
        } else {
            reasons.join("; ")
        },
    })
}
