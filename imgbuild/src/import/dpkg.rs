//! The packages an imported image's dpkg database lists as installed, so that a policy's
//! package rules can be checked against it. The file is found inside the rootfs like every
//! other path (an image whose `/var/lib/dpkg` is a symlink cannot make us read the host's).

use crate::deb::RelPath;
use crate::deb::path::resolve_existing;
use std::io::Read;
use std::path::Path;
use vse_image::manifest::InstalledPackage;

const STATUS: &str = "var/lib/dpkg/status";
/// Far above any real status file (a full desktop install is ~5 MiB).
const STATUS_LIMIT: u64 = 64 << 20;

/// `None` when the image has no dpkg database; else its installed packages, sorted.
pub fn installed_packages(root: &Path) -> Option<Vec<InstalledPackage>> {
    let rel = RelPath::parse(STATUS.as_bytes()).ok()?;
    let host = resolve_existing(root, &rel).ok()?;
    let md = std::fs::symlink_metadata(&host).ok()?;
    if !md.is_file() {
        return None;
    }
    let mut text = String::new();
    std::fs::File::open(&host)
        .ok()?
        .take(STATUS_LIMIT)
        .read_to_string(&mut text)
        .ok()?;
    let stanzas = vsec::index::deb822::parse_stanzas(&host, &text).ok()?;
    let mut out: Vec<InstalledPackage> = stanzas
        .iter()
        .filter(|s| {
            // `install ok installed`: the third word is the package's state.
            s.get("Status")
                .is_some_and(|st| st.split_whitespace().nth(2) == Some("installed"))
        })
        .filter_map(|s| {
            Some(InstalledPackage {
                name: s.get("Package")?.trim().to_string(),
                version: s.get("Version")?.trim().to_string(),
                architecture: s.get("Architecture").unwrap_or("").trim().to_string(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    Some(out)
}
