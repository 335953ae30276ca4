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
    /// Set for images made by `vse import` from a container image or rootfs tarball: where
    /// the root file system came from (absent in built images and older manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<Imported>,
    /// What produced the image and how its root was made (absent in older manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// The policy stack the image was built or imported under, site first (for the record:
    /// a launch checks the image against the stack in force then, not this one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyRef>,
}

/// One policy file of a stack: where it was and the SHA256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyRef {
    pub file: String,
    pub sha256: String,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Provenance {
    /// The layer this image's configured root is (saved for later builds when it was new).
    pub layer: String,
    pub packages: Vec<PackageRef>,
    pub steps: Vec<Step>,
}

/// Provenance of an imported image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Imported {
    /// `oci-archive`, `oci`, `docker-archive` or `tar`.
    pub source_kind: String,
    /// The source as given (`oci-archive:debian.tar`).
    pub source: String,
    /// The image's identity: the manifest digest (OCI), the config digest (Docker's image
    /// id) or the tarball's SHA256 (`tar:`), as `sha256:<hex>`.
    pub source_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_digest: Option<String>,
    /// In application order (lowest first).
    pub layers: Vec<ImportedLayer>,
    /// The kernel and initramfs packages added to the image.
    pub kernel_packages: Vec<KernelPackage>,
    /// The image has a dpkg database (`/var/lib/dpkg/status`).
    pub dpkg_database: bool,
    /// Packages the dpkg database lists as installed, sorted by name.
    #[serde(default)]
    pub installed: Vec<InstalledPackage>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImportedLayer {
    /// Digest of the layer as stored (compressed), when the source names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Digest of the uncompressed tar (the config's `diff_id`), checked while unpacking.
    pub diff_id: String,
    pub compression: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelPackage {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
    pub architecture: String,
}

impl Manifest {
    /// The manifest of parts assembled by hand rather than built (a test guest's kernel and
    /// initramfs around a blank disk): no lock, no packages, no agent digest.
    pub fn assembled(builder: &str, kernel_cmdline: &str, parts: BTreeMap<String, Part>) -> Self {
        Manifest {
            format: MANIFEST_FORMAT,
            builder: builder.into(),
            lock_hash: String::new(),
            customization_hash: String::new(),
            epoch: 0,
            kernel_version: String::new(),
            kernel_cmdline: kernel_cmdline.into(),
            root_format: "ext4".into(),
            root_uuid: String::new(),
            root_label: "vse-root".into(),
            agent_path: "/usr/lib/vse/vse-agent".into(),
            agent_sha256: String::new(),
            packages: 0,
            initramfs: InitramfsInfo {
                modules: vec![],
                builtin: vec![],
                unavailable: vec![],
            },
            parts,
            imported: None,
            provenance: None,
            policies: vec![],
        }
    }

    /// The manifest of `dir`, if it has a readable one (see [`crate::ImageDir::open`] for why
    /// not).
    pub fn read(dir: &Path) -> Option<Manifest> {
        let text = crate::read_manifest(&dir.join(MANIFEST)).ok()?;
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
