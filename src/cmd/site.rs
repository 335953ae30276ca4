//! The policy stack of a command: the site's policies (`vsec::site`), which no flag can
//! leave out, then the ones given with `--policy`; and the check every image passes before
//! it boots (`vsec::admit`).

use anyhow::Result;
use std::path::{Path, PathBuf};
use vsec::site::{PolicyStack, SiteEnv, StackError, site_policies};

/// The site's policies, then `extra` (a file already in the site's stack is not stacked twice),
/// for commands that pass the paths on.
pub fn stacked(extra: &[PathBuf]) -> Result<Vec<PathBuf>> {
    Ok(vsec::site::stack_files(&SiteEnv::from_process(), &[], extra)?.0)
}

/// The policy stack of this command: the site's policies, then `user`; problems printed.
pub fn policy_stack(user: &[PathBuf]) -> Result<PolicyStack> {
    PolicyStack::load(&SiteEnv::from_process(), &[], user).map_err(|e| match e {
        StackError::Invalid(d) => super::envload::reported(&"the policies", d),
        e => unread(e),
    })
}

/// A stack that could not be read, as the error of its own type (which the exit code knows).
pub fn unread(e: StackError) -> anyhow::Error {
    match e {
        StackError::Site(e) => e.into(),
        StackError::Read(e) => e.into(),
        StackError::Invalid(d) => d.into(),
    }
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

/// Where an image passes admission: a directory the user named (`vse run`, `vse launch
/// IMAGE`), or one `vse launch SPEC` built just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFrom {
    Named,
    Spec,
}

/// Refuses an image the stack of `policies` (after the site's) does not admit: one built
/// before a rule it breaks, imported where imports are not allowed, or unsigned where a
/// signature is required. Returns the directory to boot: under `images.signed_by`, a private
/// copy made from the very bytes that were checked (see [`vsec::admit::Admitted`]), else
/// `image` itself.
pub fn admit(image: &Path, policies: &[PathBuf], from: ImageFrom) -> Result<PathBuf> {
    admit_stack(image, &policy_stack(policies)?, from)
}

fn admit_stack(image: &Path, stack: &PolicyStack, from: ImageFrom) -> Result<PathBuf> {
    let st = stack
        .rules()
        .map_err(|problems| super::envload::reported(&stack.describe(), problems))?;
    if from == ImageFrom::Spec {
        spec_unsigned(&st)?;
    }
    let admitted = vsec::admit::Admitted::open(image)?;
    admitted.check(&st)?;
    let booted = if st.images.signed_by.is_empty() {
        image.to_path_buf()
    } else {
        let store = imgbuild::fetch::DebCache::default_root().join("admitted");
        admitted.publish(&store, vsec::admit::Readers::Owner)?
    };
    // The stores vse keeps under its cache root (built images, admitted copies) stay within
    // the policies' cache bounds; a user's own directory is never touched.
    if let Some(store) = vse_base::cache::image_store_of(&booted) {
        let limits = vsec::merge::limits(&st).cache();
        for line in vse_base::evict::keep(&[&store], &booted, &limits) {
            eprintln!("vse: {line}");
        }
    }
    Ok(booted)
}

/// A spec is built here, by the user: under `images.signed_by` its image could never boot,
/// so it is refused before the build.
pub fn refuse_spec_when_signed(policies: &[PathBuf]) -> Result<()> {
    let stack = policy_stack(policies)?;
    let st = stack
        .rules()
        .map_err(|problems| super::envload::reported(&stack.describe(), problems))?;
    spec_unsigned(&st)
}

fn spec_unsigned(st: &vsec::merge::Stack) -> Result<()> {
    match st.images.signed_by.first() {
        Some(rule) => Err(crate::exit::invalid(format!(
            "{}: the site requires signed images (images.signed_by), and an image built here \
             from a spec is unsigned; hint: have the site's build service build and sign it \
             (`vse build`, `vse sign`) and launch that image",
            rule.at
        ))),
        None => Ok(()),
    }
}

/// What `vse run` must obey: the site's limits for one QEMU VM of this size, its shares, and
/// the image check of a launch. Returns the directory to boot (see [`admit`]) and the
/// shares, resolved.
pub fn run_rules(
    image: &Path,
    vcpus: u32,
    memory_mib: u64,
    guest_root: bool,
    shares: (&[String], bool),
) -> Result<(PathBuf, Vec<vsec::shares::ResolvedShare>)> {
    let stack = policy_stack(&[])?;
    let rules = stack
        .launch_rules()
        .map_err(|problems| super::envload::reported(&"the site's policies", problems))?;
    rules.check_vm(vcpus, memory_mib)?;
    if guest_root {
        rules.check_guest_root("--guest-root")?;
    }
    rules.hypervisor(Some(vsec::units::Hypervisor::Qemu))?;
    let share_rules = super::shares::rules_of_policies(&stack.policies)?;
    let shares = super::shares::resolve(share_rules, Vec::new(), shares.0, shares.1)?;
    Ok((admit_stack(image, &stack, ImageFrom::Named)?, shares))
}
