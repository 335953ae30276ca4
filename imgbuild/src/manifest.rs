//! `manifest.json`: what an image is and how to boot it. Written last, so an output
//! directory with a manifest is complete.

use crate::initramfs::InitramfsInfo;
use std::collections::BTreeMap;
use std::path::Path;

pub const MANIFEST: &str = "manifest.json";
pub const MANIFEST_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Part {
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// `imgbuild <version>`.
    pub builder: String,
    pub lock_hash: String,
    /// Hash of the spec/policy customisation applied on top of the lock.
    pub customization_hash: String,
    pub epoch: u64,
    pub kernel_version: String,
    pub kernel_cmdline: String,
    /// Always `ext4` (raw); `qcow2`/`tar.gz` are extra parts.
    pub root_format: String,
    pub root_uuid: String,
    pub root_label: String,
    /// Path of the guest agent inside the image.
    pub agent_path: String,
    pub packages: usize,
    pub initramfs: InitramfsInfo,
    /// `kernel`, `initrd`, `root` (+ `qcow2`, `tar`) → file, size, SHA256.
    pub parts: BTreeMap<String, Part>,
    /// What produced the image and how its root was made (absent in older manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// One package of the image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PackageRef {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

/// One customisation step applied on top of the packages, in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// `file /etc/x`, `group g`, `user u`, `environment`, `post-install 1`, `policy file /p`,
    /// `guest agent`.
    pub what: String,
    /// SHA256 of what the step writes or runs.
    pub sha256: String,
}

/// How the configured root (every package unpacked and configured, before the spec's
/// steps) was obtained.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RootSource {
    /// Unpacked and configured here; `why` says why no layer could be used.
    Clean { why: String },
    /// The layer of this exact package set.
    Layer { layer: String },
    /// Another layer with packages added and removed (each provably inert).
    Delta {
        from_layer: String,
        added: Vec<String>,
        removed: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Provenance {
    pub root: RootSource,
    /// The layer this image's configured root is (saved for later builds when it was new).
    pub layer: String,
    pub packages: Vec<PackageRef>,
    pub steps: Vec<Step>,
}

impl Manifest {
    pub fn read(dir: &Path) -> Option<Manifest> {
        let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Every part is present with its recorded size (a cheap completeness check).
    pub fn parts_present(&self, dir: &Path) -> bool {
        self.parts
            .values()
            .all(|p| std::fs::metadata(dir.join(&p.file)).is_ok_and(|m| m.len() == p.size))
    }

    pub fn part_path(&self, dir: &Path, part: &str) -> Option<std::path::PathBuf> {
        self.parts.get(part).map(|p| dir.join(&p.file))
    }
}
