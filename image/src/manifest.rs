//! `manifest.json`: what an image is and how to boot it. Written last, so an output
//! directory with a manifest is complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const MANIFEST: &str = "manifest.json";
pub const MANIFEST_FORMAT: u32 = 1;

/// What went into the initramfs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InitramfsInfo {
    /// Modules loaded by `/init`, in load order.
    pub modules: Vec<String>,
    /// Requested drivers the kernel builds in.
    pub builtin: Vec<String>,
    /// Optional drivers this kernel does not have.
    pub unavailable: Vec<String>,
}

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
    /// SHA256 of the guest agent baked in: a new agent is a new image, not a cache hit.
    #[serde(default)]
    pub agent_sha256: String,
    pub packages: usize,
    pub initramfs: InitramfsInfo,
    /// `kernel`, `initrd`, `root` (+ `qcow2`, `tar`) → file, size, SHA256.
    pub parts: BTreeMap<String, Part>,
}

impl Manifest {
    /// The manifest of `dir`, if it has a readable one (see [`crate::ImageDir::open`] for why
    /// not).
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

    pub fn part_path(&self, dir: &Path, part: &str) -> Option<PathBuf> {
        self.parts.get(part).map(|p| dir.join(&p.file))
    }
}
