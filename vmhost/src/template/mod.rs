//! Boot templates: the first boot of an image with a given profile on a node saves the VM's
//! memory state once its guest agent answers, with its disk overlay as it is at that instant;
//! later VMs of the same image and profile are restored from it instead of booting.
//!
//! A template lives in `<dir>/<key>/` (the node's image cache, `.templates/`): `state` (the
//! hypervisor's saved state), `root.qcow2` (the overlay, its backing file the image's root
//! disk) and `meta.json` (the key's inputs, each file's size and SHA-256, the backing path).
//! The key is the SHA-256 of every input a saved state depends on ([`TemplateInputs`]): the
//! image's content, the kernel command line, vCPUs, memory, disks, NIC or not, hypervisor and
//! its binary and version. Change any and the key changes, so a stale template is never used.
//!
//! Published atomically: built in a private temporary directory, renamed into place; a
//! directory that exists is complete. One VM per key saves at a time (an advisory lock); a
//! second publisher loses the rename and drops its own. A template that fails its checks
//! (meta unreadable, inputs or checksums differ) is discarded and the VM boots cold.

mod files;
mod flow;

pub use flow::BootKind;
pub(crate) use flow::boot;

use crate::spec::{VmSpec, hex};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use v2m::{Availability, Plugin, PluginKind, V2mError};
use vse_guest_agent::LinkError;

/// Bumped when the layout or the meaning of an input changes: older templates are unused.
/// 2: a NUMA-bound VM's RAM block is `pc.ram` (was `ram0`), which older states cannot load into.
pub const TEMPLATE_FORMAT: u32 = 2;
pub(crate) const STATE: &str = "state";
pub(crate) const ROOT: &str = "root.qcow2";
const META: &str = "meta.json";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a template's meta file: {source}", path.display())]
    Meta {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("template {key} was saved for other inputs (format {format})")]
    Inputs { key: String, format: u32 },
    #[error("template file {} is damaged: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error("{0} VMs have no boot templates (only QEMU's saved states are used)")]
    Unsupported(PluginKind),
    #[error("the hypervisor is not available: {0}")]
    Hypervisor(String),
    #[error("rebasing the template's overlay onto this node's image: {0}")]
    Rebase(#[source] V2mError),
    #[error("saving the VM's state: {0}")]
    Checkpoint(#[source] V2mError),
    #[error("resuming the VM after saving its state: {0}")]
    Resume(#[source] V2mError),
    #[error("restoring the saved state: {0}")]
    Restore(#[source] V2mError),
    #[error(
        "the image's guest agent cannot give restored VMs their own identity (it predates boot templates): rebuild the image"
    )]
    OldAgent,
    #[error("the booted VM has no {0}")]
    Restored(&'static str),
    #[error("starting the restored VM: {0}")]
    Started(#[source] crate::boot::BootError),
    #[error("giving the restored VM its own identity: {0}")]
    Reidentify(#[source] LinkError),
}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TemplateError {
    let path = path.to_path_buf();
    move |source| TemplateError::Io { what, path, source }
}

/// A part of the image the manifest gives no digest for, known by file identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: i128,
    pub inode: u64,
}

/// Everything a saved state depends on. Per-VM values that the restored VM gets anew (name,
/// pinned cores, the NIC's MAC and endpoints, disk paths) are not inputs; the NUMA node the
/// memory is bound to is (QEMU starts with that memory backend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInputs {
    pub format: u32,
    pub image_manifest_sha256: String,
    pub image_files: Vec<FileId>,
    pub cmdline: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub numa_node: Option<u32>,
    /// Each disk's format and whether it is read-only, in guest order.
    pub disks: Vec<String>,
    /// The NIC's kind ("none" without one).
    pub nic: String,
    pub hypervisor: PluginKind,
    /// The hypervisor's binary and version, as its probe reports them.
    pub hypervisor_build: String,
}

impl TemplateInputs {
    /// The inputs of `spec` booted through `plugin` on this node.
    pub fn of(plugin: &dyn Plugin, spec: &VmSpec) -> Result<Self, TemplateError> {
        if plugin.kind() != PluginKind::Qemu {
            return Err(TemplateError::Unsupported(plugin.kind()));
        }
        let hypervisor_build = match plugin.probe() {
            Availability::Available { detail } => detail,
            Availability::NotAvailable { reason } => {
                return Err(TemplateError::Hypervisor(reason));
            }
        };
        let id = spec.image_identity();
        let image_files = (id.undigested.iter())
            .map(|p| file_id(p))
            .collect::<Result<_, _>>()?;
        let profile = spec.profile(Path::new("/template/root.qcow2"));
        let nic = format!("{:?}", profile.network.mode).to_lowercase();
        Ok(TemplateInputs {
            format: TEMPLATE_FORMAT,
            image_manifest_sha256: id.manifest_sha256.clone(),
            image_files,
            cmdline: profile.full_cmdline(),
            vcpus: profile.vcpus,
            memory_mib: profile.memory_mib,
            numa_node: profile.numa_node,
            disks: (profile.disks.iter())
                .map(|d| {
                    format!(
                        "{}{}",
                        d.format.as_str(),
                        if d.readonly { ",ro" } else { "" }
                    )
                })
                .collect(),
            nic,
            hypervisor: plugin.kind(),
            hypervisor_build,
        })
    }

    /// The template's name: SHA-256 of the inputs.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex(&sha2::Sha256::digest(&json))
    }
}

fn file_id(path: &Path) -> Result<FileId, TemplateError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(io("reading the image part", path))?;
    Ok(FileId {
        path: path.to_path_buf(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        inode: m.ino(),
    })
}

/// A file of a template, as its meta file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    pub size: u64,
    pub sha256: String,
}

/// `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub key: String,
    pub inputs: TemplateInputs,
    /// The root disk the overlay's backing file names (the saving node's image copy).
    pub backing: PathBuf,
    pub files: BTreeMap<String, FileSum>,
    /// The saving link's next request id: replies to earlier requests (the boot's readiness
    /// pings) may still sit in the saved guest, so a restored VM's link starts here.
    pub next_request_id: u64,
}

/// A template found complete and intact.
#[derive(Debug)]
pub struct Template {
    pub dir: PathBuf,
    pub meta: Meta,
}

impl Template {
    pub fn state(&self) -> PathBuf {
        self.dir.join(STATE)
    }

    pub fn root(&self) -> PathBuf {
        self.dir.join(ROOT)
    }
}

/// The templates of one node: a directory in its image cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    dir: PathBuf,
}

impl Templates {
    /// Templates in `dir` (created when the first one is saved).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Templates { dir: dir.into() }
    }

    /// The templates of an image cache: `<cache>/.templates`.
    pub fn in_cache(cache: &Path) -> Self {
        Self::new(cache.join(".templates"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the template of `key` is (or would be).
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The template of `inputs`: `None` when there is none; an error (after discarding it)
    /// when one is there but unreadable, saved for other inputs, or damaged.
    pub fn lookup(&self, inputs: &TemplateInputs) -> Result<Option<Template>, TemplateError> {
        let key = inputs.key();
        let dir = self.path(&key);
        if !dir.is_dir() {
            return Ok(None);
        }
        let checked = check(&dir, &key, inputs);
        if checked.is_err() {
            self.discard(&dir);
        }
        checked.map(|meta| Some(Template { dir, meta }))
    }

    /// Removes a template: renamed away first, so no one finds it half-removed (a VM that
    /// already opened its files keeps reading them).
    pub fn discard(&self, dir: &Path) {
        let trash = self
            .dir
            .join(format!(".trash-{}-{}", std::process::id(), files::unique()));
        if std::fs::rename(dir, &trash).is_ok() {
            let _ = std::fs::remove_dir_all(&trash);
        }
    }
}

/// Reads a template's meta file and checks it against `inputs` and its files.
fn check(dir: &Path, key: &str, inputs: &TemplateInputs) -> Result<Meta, TemplateError> {
    let path = dir.join(META);
    let text = std::fs::read(&path).map_err(io("reading", &path))?;
    let meta: Meta =
        serde_json::from_slice(&text).map_err(|source| TemplateError::Meta { path, source })?;
    if meta.key != key || meta.inputs != *inputs {
        return Err(TemplateError::Inputs {
            key: key.to_string(),
            format: meta.inputs.format,
        });
    }
    for name in [STATE, ROOT] {
        let path = dir.join(name);
        let want = meta.files.get(name).ok_or_else(|| TemplateError::Corrupt {
            path: path.clone(),
            why: "not listed in meta.json".into(),
        })?;
        let got = files::sum(&path)?;
        if got != *want {
            let why = format!(
                "{} bytes with SHA-256 {}, meta.json says {} bytes with {}",
                got.size, got.sha256, want.size, want.sha256
            );
            return Err(TemplateError::Corrupt { path, why });
        }
    }
    Ok(meta)
}

#[cfg(test)]
mod tests;
