//! Where a migrating VM's disks are on the destination. Shared storage is detected, not
//! assumed: the source leaves a random token in a file next to the VM's overlay
//! ([`leave_probe`]); a destination that reads the same token at the same path sees the same
//! disk and opens it in place, any other copies the disk ([`DiskMigration::Copy`]).
//! A destination never trusts the source's paths for the image either: it boots on its own
//! copy of the image, found by digest in its own store ([`on_local_image`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use v2m::Profile;
use vse_image::ImageDir;

/// Probe files are named so, next to the overlay; a destination reads no other file.
const PROBE_PREFIX: &str = ".vse-probe-";

/// What the destination needs to test for shared storage.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StorageProbe {
    pub path: PathBuf,
    pub token: String,
}

/// The source's probe file; removed on drop (once the destination answered).
#[derive(Debug)]
pub struct ProbeFile(StorageProbe);

impl ProbeFile {
    pub fn probe(&self) -> &StorageProbe {
        &self.0
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0.path);
    }
}

/// Source: writes a fresh random token next to `disk` (the VM's overlay).
pub fn leave_probe(disk: &Path) -> std::io::Result<ProbeFile> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let dir = disk.parent().unwrap_or(Path::new("/"));
    let path = dir.join(format!("{PROBE_PREFIX}{}", &token[..8]));
    std::fs::write(&path, &token)?;
    Ok(ProbeFile(StorageProbe { path, token }))
}

impl StorageProbe {
    /// Destination: whether this node sees the source's disk `disk` itself — the probe must
    /// sit next to it and hold the token.
    pub fn visible_with(&self, disk: &Path) -> bool {
        let next_to = self.path.parent() == disk.parent() && disk.parent().is_some();
        let named = self
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PROBE_PREFIX) && !n.contains('/'));
        if !next_to || !named || !disk.is_file() {
            return false;
        }
        let mut text = String::new();
        let read =
            std::fs::File::open(&self.path).and_then(|f| f.take(256).read_to_string(&mut text));
        read.is_ok() && !self.token.is_empty() && text == self.token
    }
}

/// `profile` (as the source runs it) on this node's own copy of its image: kernel,
/// initramfs and base root disk from `image`, whatever paths the source had.
pub fn on_local_image(profile: &Profile, image: &ImageDir) -> Profile {
    let mut p = profile.clone();
    p.image.kernel = image.kernel().to_path_buf();
    p.image.initrd = Some(image.initrd().to_path_buf());
    p.image.root_disk = Some(image.root().to_path_buf());
    // The source's node number means nothing here: bind to this host's node of the cores.
    p.numa_node = (p.cpuset.as_ref())
        .and_then(|c| crate::numa::node_of(c.cpus(), &crate::numa::host_nodes()));
    p
}
