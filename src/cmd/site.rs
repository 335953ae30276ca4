//! The policy stack of a command: the site's policies (`vsec::site`), which no flag can
//! leave out, then the ones given with `--policy`; and the check every image passes before
//! it boots (`vsec::admit`).

use anyhow::Result;
use std::path::{Path, PathBuf};
use vsec::site::{SiteEnv, site_policies};

/// The site's policies, then `extra` (a file already in the site's stack is not stacked twice).
pub fn stacked(extra: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut all = site_policies(&SiteEnv::from_process())?;
    let seen: Vec<PathBuf> = all.iter().filter_map(|p| p.canonicalize().ok()).collect();
    all.extend(
        extra
            .iter()
            .filter(|p| p.canonicalize().map_or(true, |c| !seen.contains(&c)))
            .cloned(),
    );
    Ok(all)
}

/// A lockfile names its own policies; it must name every policy of the site as it is now,
/// or an image could be built from a lock made before the site added a rule.
pub fn lock_covers_site(lock: &Path) -> Result<()> {
    let site = site_policies(&SiteEnv::from_process())?;
    if site.is_empty() {
        return Ok(());
    }
    let parsed = vsec::lock::Lockfile::read(lock)?;
    let base = lock.parent().unwrap_or(Path::new("."));
    let named: Vec<PathBuf> = (parsed.source.policies.iter())
        .filter_map(|p| base.join(p).canonicalize().ok())
        .collect();
    for p in site {
        if !p.canonicalize().is_ok_and(|c| named.contains(&c)) {
            return Err(crate::exit::invalid(format!(
                "{}: the lock was made without the site policy {}; hint: re-run `vse lock` (or `vse build SPEC`)",
                lock.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// Refuses an image the stack `policies` does not admit: one built before a rule it breaks,
/// imported where imports are not allowed, or unsigned where a signature is required.
pub fn admit(image: &Path, policies: &[PathBuf]) -> Result<()> {
    let loaded = super::envload::load_policies(policies)?
        .map_err(|problems| super::envload::reported(&"the policies", problems))?;
    admit_loaded(image, &loaded)
}

fn admit_loaded(image: &Path, policies: &[vsec::policy::Policy]) -> Result<()> {
    let dir = vse_image::ImageDir::open(image).map_err(|e| crate::exit::invalid(e.to_string()))?;
    let (st, _) = vsec::merge::stack(policies);
    vsec::admit::admit(image, dir.manifest(), &st)?;
    Ok(())
}

/// What `vse run` must obey: the site's limits for one QEMU VM of this size, and the image
/// check of a launch.
pub fn run_rules(image: &Path, vcpus: u32, memory_mib: u64) -> Result<()> {
    let policies = stacked(&[])?;
    let loaded = super::envload::load_policies(&policies)?
        .map_err(|problems| super::envload::reported(&"the site's policies", problems))?;
    let rules = vsec::launch::LaunchRules::from_policies(&loaded)
        .map_err(|problems| super::envload::reported(&"the site's policies", problems))?;
    rules.check_vm(vcpus, memory_mib)?;
    rules.hypervisor(Some(vsec::units::Hypervisor::Qemu))?;
    admit_loaded(image, &loaded)
}
