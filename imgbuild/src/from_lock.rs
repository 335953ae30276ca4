//! A [`BuildPlan`] from a verified lockfile ([`vsec::resolve::verify_lock`]): URLs, sizes and
//! hashes come from the verified indices, never from the lock's text. The plan's identity is
//! the SHA256 of the lock's exact bytes, so any edit of the lock (even a comment) is a
//! rebuild, and two equal locks share a cache.

use crate::plan::{BuildPlan, PlannedPackage, parse_release_date};
use sha2::{Digest, Sha256};
use vsec::resolve::VerifiedLock;

#[derive(Debug, thiserror::Error)]
pub enum FromLockError {
    #[error(
        "SOURCE_DATE_EPOCH={value:?} is not a number of seconds; hint: unset it or set e.g. SOURCE_DATE_EPOCH=1747699200"
    )]
    SourceDateEpoch { value: String },
    #[error(
        "no repository has a readable Release date (expected e.g. \"Sat, 10 May 2025 08:00:00 UTC\"); hint: set SOURCE_DATE_EPOCH"
    )]
    NoEpoch,
}

/// The lock (or `SOURCE_DATE_EPOCH`) is the user's input.
impl vse_exit::Classify for FromLockError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// `source_date_epoch` is the value of `SOURCE_DATE_EPOCH` if set (passed in, so callers and
/// tests decide; the library never reads the environment).
pub fn plan_from_lock(
    verified: &VerifiedLock,
    lock_bytes: &[u8],
    source_date_epoch: Option<&str>,
) -> Result<BuildPlan, FromLockError> {
    let lock = &verified.lock;
    let epoch = match source_date_epoch {
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| FromLockError::SourceDateEpoch { value: v.into() })?,
        None => lock
            .repositories
            .iter()
            .filter_map(|r| parse_release_date(&r.release_date))
            .max()
            .ok_or(FromLockError::NoEpoch)?,
    };
    let packages = verified
        .packages
        .iter()
        .map(|p| PlannedPackage {
            name: p.name.to_string(),
            version: p.version.to_string(),
            url: p.url.clone(),
            size: p.size,
            sha256: p.sha256.clone(),
            kernel: p.kernel,
        })
        .collect();
    Ok(BuildPlan {
        lock_hash: lock_hash(lock_bytes),
        epoch,
        packages,
    })
}

/// The identity of a lock: `sha256:` and the hex SHA256 of its bytes.
pub fn lock_hash(lock_bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(lock_bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use vsec::lock::{Lockfile, Reason};
    use vsec::resolve::VerifiedPackage;

    const LOCK: &str = r#"
format = 1
env_hash = "sha256:00"
generator = "vse test"
architecture = "amd64"

[source]
spec = "min.vse.yaml"

[[repositories]]
url = "http://deb.example/debian/"
suite = "bookworm"
components = ["main"]
release_date = "Sat, 10 May 2025 08:00:00 UTC"
release_sha256 = "ab"

[[repositories]]
url = "http://sec.example/debian-security"
suite = "bookworm-security"
components = ["main"]
release_date = "Sun, 11 May 2025 08:00:00 UTC"
release_sha256 = "cd"

[[packages]]
name = "busybox-static"
version = "1:1.35.0-4+b3"
architecture = "amd64"
filename = "pool/main/b/busybox/busybox-static_1.35.0-4+b3_amd64.deb"
size = 10
sha256 = "AA"
repository = 0
reason = { kind = "requested" }

[[packages]]
name = "linux-image-6.1.0-40-cloud-amd64"
version = "6.1.153-1"
architecture = "amd64"
filename = "pool/updates/main/l/linux/k.deb"
size = 20
sha256 = "bb"
repository = 1
reason = { kind = "kernel" }
"#;

    fn lock() -> Lockfile {
        Lockfile::from_toml(Path::new("t.lock"), LOCK).unwrap()
    }

    /// What the verifier hands over for [`LOCK`]: the index's records (here, the lock's own).
    fn verified(lock: Lockfile) -> VerifiedLock {
        let packages = lock
            .packages
            .iter()
            .map(|p| VerifiedPackage {
                name: p.name.clone(),
                version: p.version.clone(),
                architecture: p.architecture.clone(),
                url: format!("http://verified.example/{}", p.filename),
                size: p.size,
                sha256: p.sha256.to_ascii_lowercase(),
                kernel: p.reason == Reason::Kernel,
            })
            .collect();
        VerifiedLock {
            lock,
            packages,
            resigned: vec![],
        }
    }

    #[test]
    fn verified_urls_sizes_hashes_kernel_and_identity() {
        let plan = plan_from_lock(&verified(lock()), LOCK.as_bytes(), None).unwrap();
        let p = &plan.packages;
        assert_eq!(
            p[0].url,
            "http://verified.example/pool/main/b/busybox/busybox-static_1.35.0-4+b3_amd64.deb"
        );
        assert_eq!((p[0].size, p[0].sha256.as_str()), (10, "aa"));
        assert_eq!(p[0].version, "1:1.35.0-4+b3");
        assert!(!p[0].kernel && p[1].kernel);
        // The newest Release date: 11 May 2025 08:00 UTC.
        assert_eq!(plan.epoch, 1_746_950_400);
        let h = hex::encode(Sha256::digest(LOCK.as_bytes()));
        assert_eq!(plan.lock_hash, format!("sha256:{h}"));
        let edited = format!("{LOCK}\n# comment\n");
        let other = plan_from_lock(&verified(lock()), edited.as_bytes(), None).unwrap();
        assert_ne!(other.lock_hash, plan.lock_hash);
    }

    #[test]
    fn source_date_epoch_wins_and_is_validated() {
        let plan = plan_from_lock(&verified(lock()), LOCK.as_bytes(), Some("1234")).unwrap();
        assert_eq!(plan.epoch, 1234);
        let e = plan_from_lock(&verified(lock()), LOCK.as_bytes(), Some("yesterday")).unwrap_err();
        assert!(e.to_string().contains("SOURCE_DATE_EPOCH"), "{e}");
    }

    #[test]
    fn missing_dates_are_an_error() {
        let mut l = lock();
        for r in &mut l.repositories {
            r.release_date = "soon".into();
        }
        let e = plan_from_lock(&verified(l), LOCK.as_bytes(), None).unwrap_err();
        assert!(matches!(e, FromLockError::NoEpoch), "{e}");
    }
}
