//! The kernel and initramfs of an imported image: the locked kernel package and the static
//! busybox the initramfs runs on, fetched through the `.deb` cache and unpacked into a root
//! of their own (the imported rootfs is never asked to hold or run anything for them).

use super::ImportError;
use crate::deb::{self, Kind, Meta, Records};
use crate::fetch::DebCache;
use crate::plan::BuildPlan;
use crate::progress::Progress;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use vsec::lock::Reason;
use vsec::resolve::VerifiedLock;

/// The package the initramfs's shell comes from.
pub const BUSYBOX: &str = "busybox-static";
/// Largest data tarball accepted from the kernel's packages.
const DATA_LIMIT: u64 = 2 << 30;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "the lock has no kernel package (reason `kernel`); hint: lock a spec that names a kernel, or drop --kernel-from"
    )]
    NoKernel,
    #[error(
        "the lock has no {BUSYBOX} package; hint: lock it with the kernel (`vse lock` adds it for the initramfs)"
    )]
    NoBusybox,
    #[error(transparent)]
    Plan(#[from] crate::from_lock::FromLockError),
}

/// Just the kernel (with the versioned image package its metapackage pulls in) and busybox of
/// a lock. The plan's identity is those packages' hashes, not the whole lock's.
pub fn kernel_plan(verified: &VerifiedLock) -> Result<BuildPlan, KernelError> {
    let lock = &verified.lock;
    let full = crate::from_lock::plan_from_lock(verified, lock.to_toml().as_bytes(), Some("0"))?;
    let kernels: Vec<String> = lock
        .packages
        .iter()
        .filter(|p| p.reason == Reason::Kernel)
        .map(|p| p.name.to_string())
        .collect();
    if kernels.is_empty() {
        return Err(KernelError::NoKernel);
    }
    let wanted = |name: &str| -> bool {
        if name == BUSYBOX || kernels.iter().any(|k| k == name) {
            return true;
        }
        name.starts_with("linux-image-")
            && lock.packages.iter().any(|p| {
                p.name.as_str() == name
                    && matches!(&p.reason, Reason::Dependency { of } if kernels.iter().any(|k| k == of.as_str()))
            })
    };
    let packages: Vec<_> = full
        .packages
        .into_iter()
        .filter(|p| wanted(&p.name))
        .collect();
    if !packages.iter().any(|p| p.name == BUSYBOX) {
        return Err(KernelError::NoBusybox);
    }
    let mut h = Sha256::new();
    for p in &packages {
        h.update(format!("{} {} {}\n", p.name, p.version, p.sha256));
    }
    Ok(BuildPlan {
        lock_hash: format!("sha256:{}", hex::encode(h.finalize())),
        epoch: 0,
        packages,
    })
}

/// Fetches and unpacks the plan's packages into `kroot`; returns the kernel version.
pub fn unpack_kernel(
    plan: &BuildPlan,
    cache_root: &Path,
    jobs: usize,
    kroot: &Path,
    progress: &dyn Progress,
) -> Result<String, ImportError> {
    let cache = DebCache::open(cache_root)?;
    let wants = plan.wants();
    let debs = cache.fetch_all(&wants, jobs, progress)?;
    // Merged /usr, as in built images: the initramfs takes busybox from /usr/bin and the
    // modules from /usr/lib/modules.
    for d in ["bin", "lib"] {
        let target = kroot.join("usr").join(d);
        std::fs::create_dir_all(&target).map_err(|e| ImportError::io(&target, e))?;
        let link = kroot.join(d);
        std::os::unix::fs::symlink(format!("usr/{d}"), &link)
            .map_err(|e| ImportError::io(&link, e))?;
    }
    let mut records = Records::new();
    records.insert(
        "/".into(),
        Meta {
            kind: Kind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
        },
    );
    for (p, d) in plan.packages.iter().zip(&debs) {
        deb::read_deb(d, DATA_LIMIT, |data| {
            deb::extract_data(data, kroot, &mut records)
                .map(|_| ())
                .map_err(|source| ImportError::KernelPackage {
                    package: p.name.clone(),
                    reason: source.to_string(),
                })
        })?;
    }
    crate::build::find_kernel(kroot, plan).map_err(|e| ImportError::KernelPackage {
        package: plan
            .packages
            .iter()
            .find(|p| p.kernel)
            .map(|p| p.name.clone())
            .unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// `boot/vmlinuz-<kver>` in the kernel root.
pub fn vmlinuz(kroot: &Path, kver: &str) -> PathBuf {
    kroot.join("boot").join(format!("vmlinuz-{kver}"))
}
