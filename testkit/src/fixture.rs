//! What the `.ci/` scripts prepare for the tests: env files under `$VSE_CACHE/fixtures`
//! (the busybox test guest of `.ci/fixtures.sh`, the migration guest of
//! `.ci/migrate-guest.sh`) and programs named by environment variables (`VSE_GUEST_AGENT`,
//! `VSE_MSGCHECK`). Anything missing, including a single key of an env file, is reported
//! with [`missing`](crate::missing): never a silent pass.

use std::path::{Path, PathBuf};

/// The cache root ([`vse_base::cache_root`]).
pub fn cache_dir() -> PathBuf {
    vse_base::cache_root()
}

/// A sh-sourceable `KEY=VALUE` file written by a `.ci/` script.
#[derive(Debug, Clone)]
pub struct EnvFile {
    path: PathBuf,
    script: String,
    text: String,
}

impl EnvFile {
    /// `$VSE_CACHE/fixtures/<name>`, written by `.ci/<script>`.
    #[track_caller]
    pub fn load(name: &str, script: &str) -> Option<EnvFile> {
        let path = cache_dir().join("fixtures").join(name);
        Self::load_from(&path, script)
    }

    #[track_caller]
    pub fn load_from(path: &Path, script: &str) -> Option<EnvFile> {
        match std::fs::read_to_string(path) {
            Ok(text) => Some(EnvFile {
                path: path.to_path_buf(),
                script: script.to_string(),
                text,
            }),
            Err(e) => {
                crate::missing(
                    &format!("{} ({e})", path.display()),
                    &format!("run .ci/{script}"),
                );
                None
            }
        }
    }

    /// The value of `key` (quotes removed), or `None` after reporting the key as missing.
    #[track_caller]
    pub fn get(&self, key: &str) -> Option<String> {
        let value = self.text.lines().find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix('=')
                .map(|v| v.trim().trim_matches('"').to_string())
        });
        if value.is_none() {
            crate::missing(
                &format!("{key} in {}", self.path.display()),
                &format!(
                    "run .ci/{} again: the file is from another version",
                    self.script
                ),
            );
        }
        value
    }

    /// The value of `key` as a path to an existing file.
    #[track_caller]
    pub fn file(&self, key: &str) -> Option<PathBuf> {
        let p = PathBuf::from(self.get(key)?);
        crate::require(
            p.is_file(),
            &format!("{} ({key} of {})", p.display(), self.path.display()),
            &format!("run .ci/{}", self.script),
        )
        .then_some(p)
    }
}

/// A guest booted by direct kernel boot.
#[derive(Debug, Clone)]
pub struct Guest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
}

impl Guest {
    #[track_caller]
    fn from_env(file: &str, script: &str, prefix: &str) -> Option<Guest> {
        let env = EnvFile::load(file, script)?;
        Some(Guest {
            kernel: env.file(&format!("{prefix}_KERNEL"))?,
            initrd: env.file(&format!("{prefix}_INITRD"))?,
            cmdline: env.get(&format!("{prefix}_CMDLINE"))?,
        })
    }
}

/// The busybox test guest of `.ci/fixtures.sh`: prints `VSE-READY`, then `VSE-COUNT n` on
/// the serial console every 100 ms.
#[track_caller]
pub fn test_guest() -> Option<Guest> {
    Guest::from_env("fixtures.env", "fixtures.sh", "VSE_FIXTURE")
}

/// The migration guest of `.ci/migrate-guest.sh`: the guest agent as PID 1, `msgcheck`, and
/// the same console counter.
#[track_caller]
pub fn migrate_guest() -> Option<Guest> {
    Guest::from_env("migrate.env", "migrate-guest.sh", "VSE_MIGRATE")
}

/// The file named by environment variable `var`, set by the caller from `.ci/<script>`'s
/// output (e.g. `VSE_GUEST_AGENT` from `.ci/guest-agent.sh`).
#[track_caller]
pub fn env_file(var: &str, script: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var).map(PathBuf::from);
    let ok = p.as_ref().is_some_and(|p| p.is_file());
    crate::require(
        ok,
        &format!("{var} (an existing file)"),
        &format!("export {var}=$(bash .ci/{script})"),
    )
    .then(|| p.expect("checked"))
}

/// Every `VSE-COUNT n` value the test guest printed in `log`, in order.
pub fn counters(log: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(log)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("VSE-COUNT ")?.trim().parse().ok())
        .collect()
}

/// The counter has no gap and no repeat (`what` names the scenario in the failure).
#[track_caller]
pub fn assert_consecutive(c: &[u64], what: &str) {
    for w in c.windows(2) {
        assert_eq!(
            w[1],
            w[0] + 1,
            "{what}: counter jumps from {} to {} (full: {c:?})",
            w[0],
            w[1]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_values_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.env");
        std::fs::write(&p, "A=1\nAB=\"two words\"\nB=/nonexistent\n").unwrap();
        let env = EnvFile::load_from(&p, "x.sh").unwrap();
        assert_eq!(env.get("A").as_deref(), Some("1"));
        assert_eq!(env.get("AB").as_deref(), Some("two words"));
        assert_eq!(
            counters(b"VSE-READY\nVSE-COUNT 4\r\nnoise\n VSE-COUNT 5\n"),
            [4, 5]
        );
    }

    #[test]
    fn a_missing_key_is_reported_not_passed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.env");
        std::fs::write(&p, "A=1\n").unwrap();
        let env = EnvFile::load_from(&p, "x.sh").unwrap();
        let r = std::panic::catch_unwind(|| env.get("MISSING"));
        if crate::require_all() {
            assert!(r.is_err(), "VSE_REQUIRE_ALL=1: a missing key fails");
        } else {
            assert_eq!(r.unwrap(), None);
        }
    }
}
