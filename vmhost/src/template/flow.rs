//! Booting with templates: restore from the template when there is one, else boot cold and
//! save one. A template never fails a boot: whatever goes wrong with it is said on stderr and
//! the VM boots cold.

use super::files::{self, Building};
use super::{FileSum, Meta, ROOT, STATE, Template, TemplateError, TemplateInputs, Templates, io};
use crate::boot::{self, BootError, BootOptions, OverlayDir, RunningVm};
use crate::spec::{VmSpec, hex};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use v2m::Plugin;
use v2m::overlay::adopt_overlay;
use vse_guest_agent::{GuestIdentity, GuestLink};

/// How a VM came to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootKind {
    /// Booted from its kernel.
    Cold,
    /// Booted from its kernel, and its state was saved as the template of its key.
    SavedTemplate,
    /// Restored from a template, with its own identity.
    FromTemplate,
}

/// Longest wait for the guest to take its new identity.
const REIDENTIFY: Duration = Duration::from_secs(60);

pub(crate) fn boot(
    templates: &Templates,
    plugin: &dyn Plugin,
    spec: &VmSpec,
    opts: &BootOptions,
) -> Result<RunningVm, BootError> {
    let say = |what: &str, e: &TemplateError| {
        eprintln!(
            "vse: VM {}: boot template {what}: {e}; booting cold",
            spec.name
        )
    };
    let inputs = match TemplateInputs::of(plugin, spec) {
        Ok(i) => i,
        Err(e) => {
            say("not used", &e);
            return boot::boot_cold(plugin, spec, opts);
        }
    };
    match templates.lookup(&inputs) {
        Ok(Some(t)) => match restore(&t, plugin, spec, opts) {
            Ok(vm) => return Ok(vm),
            Err(e) => {
                // A template this hypervisor cannot load is of no use to the next VM either.
                if matches!(e, TemplateError::Restore(_) | TemplateError::Reidentify(_)) {
                    templates.discard(&t.dir);
                }
                say(&format!("{} failed", short(&t.meta.key)), &e);
            }
        },
        Ok(None) => {}
        Err(e) => say(&format!("{} discarded", short(&inputs.key())), &e),
    }
    let mut vm = boot::boot_cold(plugin, spec, opts)?;
    match save(templates, &inputs, spec, &mut vm) {
        Ok(true) => vm.kind = BootKind::SavedTemplate,
        Ok(false) => {}
        Err(TemplateError::Resume(e)) => return Err(BootError::Start(e)),
        Err(e) => eprintln!(
            "vse: VM {}: saving boot template {}: {e}",
            spec.name,
            short(&inputs.key())
        ),
    }
    Ok(vm)
}

fn short(key: &str) -> &str {
    &key[..key.len().min(12)]
}

/// Saves the freshly booted `vm` as the template of `inputs` unless another VM of this node
/// is saving it or it exists already; true when this VM's template was published.
fn save(
    templates: &Templates,
    inputs: &TemplateInputs,
    spec: &VmSpec,
    vm: &mut RunningVm,
) -> Result<bool, TemplateError> {
    let key = inputs.key();
    if !knows_reidentify(vm.link()) {
        return Err(TemplateError::OldAgent);
    }
    files::private_dir(templates.dir())?;
    let Some(_lock) = files::try_lock(&templates.dir().join(format!(".lock-{key}")))? else {
        return Ok(false);
    };
    let dst = templates.path(&key);
    if dst.is_dir() {
        return Ok(false);
    }
    files::sweep_unfinished(templates.dir(), &key);
    let tmp = Building::new(templates.dir(), &key)?;
    let overlay = vm.profile().disks.first().map(|d| d.path.clone());
    let overlay = overlay.ok_or(TemplateError::Restored("disk"))?;
    // The checkpoint leaves the VM paused with its disks flushed: the overlay is copied as
    // the saved memory knows it, then the VM goes on.
    let saved = vm
        .vm_mut()
        .checkpoint(&tmp.path.join(STATE))
        .map_err(TemplateError::Checkpoint)
        .and_then(|r| Ok((r, files::copy_sparse(&overlay, &tmp.path.join(ROOT))?)));
    vm.vm_mut().resume().map_err(TemplateError::Resume)?;
    let (report, root) = saved?;
    let state = match report.sha256 {
        Some(sha256) => super::FileSum {
            size: report.bytes,
            sha256,
        },
        None => files::sum(&tmp.path.join(STATE))?,
    };
    let mut sums = BTreeMap::new();
    sums.insert(STATE.to_string(), state);
    sums.insert(ROOT.to_string(), root);
    let next_id = vm.link().next_request_id();
    write_meta(&tmp.path, inputs, spec, sums, next_id)?;
    files::publish(&tmp.path, &dst)
}

fn write_meta(
    dir: &Path,
    inputs: &TemplateInputs,
    spec: &VmSpec,
    files: BTreeMap<String, FileSum>,
    next_request_id: u64,
) -> Result<(), TemplateError> {
    let meta = Meta {
        key: inputs.key(),
        inputs: inputs.clone(),
        backing: spec.image().root_disk.clone().unwrap_or_default(),
        files,
        next_request_id,
    };
    let path = dir.join(super::META);
    let text = serde_json::to_vec_pretty(&meta).unwrap_or_default();
    let f = std::fs::File::create(&path).map_err(io("writing", &path))?;
    use std::io::Write;
    (&f).write_all(&text).map_err(io("writing", &path))?;
    f.sync_all().map_err(io("syncing", &path))
}

/// A VM of `spec` from template `t`: its own overlay (a copy of the template's, on this
/// node's image), the saved state loaded, the guest agent answering, a fresh identity.
fn restore(
    t: &Template,
    plugin: &dyn Plugin,
    spec: &VmSpec,
    opts: &BootOptions,
) -> Result<RunningVm, TemplateError> {
    let overlay = OverlayDir::create_in(&opts.scratch_prefix, opts.scratch_parent.as_deref())
        .map_err(io("creating", Path::new("scratch directory")))?;
    let disk = overlay.path().join("root.qcow2");
    files::copy_sparse(&t.root(), &disk)?;
    let base = spec.image().root_disk.clone().unwrap_or_default();
    if base != t.meta.backing {
        let qemu_img = boot::qemu_img().map_err(TemplateError::Started)?;
        adopt_overlay(&qemu_img, &disk, &base).map_err(TemplateError::Rebase)?;
    }
    let profile = spec.profile(&disk);
    let vm = plugin
        .restore_paused(&profile, &t.state())
        .map_err(TemplateError::Restore)?;
    let mut opts = opts.clone();
    opts.agent.first_id = opts.agent.first_id.max(t.meta.next_request_id);
    let mut running =
        boot::running(vm, profile, &opts, Some(overlay)).map_err(TemplateError::Started)?;
    reidentify(&running.link, spec)?;
    running.kind = BootKind::FromTemplate;
    Ok(running)
}

/// Whether the guest agent can give a restored copy of this VM its own identity: a request it
/// must refuse (nothing in it is valid) is refused by the checks of an agent that knows it,
/// and as an unknown request by an older one.
fn knows_reidentify(link: &GuestLink) -> bool {
    let probe = GuestIdentity {
        hostname: "",
        machine_id: "",
        entropy: &[],
        mac: None,
    };
    match link.reidentify(probe, REIDENTIFY) {
        Err(vse_guest_agent::LinkError::Agent(m)) => !m.contains("reidentify"),
        _ => false,
    }
}

/// A new machine id, host random bytes for the guest's RNG, the VM's hostname and MAC.
fn reidentify(link: &GuestLink, spec: &VmSpec) -> Result<(), TemplateError> {
    let mut random = [0u8; 80];
    getrandom::fill(&mut random).map_err(|e| {
        TemplateError::Reidentify(vse_guest_agent::LinkError::Agent(format!(
            "no host randomness: {e}"
        )))
    })?;
    let (machine_id, entropy) = random.split_at(16);
    let mac = spec.nic.as_ref().map(|n| n.mac.to_string());
    let identity = GuestIdentity {
        hostname: spec.name.as_str(),
        machine_id: &hex(machine_id),
        entropy,
        mac: mac.as_deref(),
    };
    link.reidentify(identity, REIDENTIFY)
        .map_err(TemplateError::Reidentify)
}
