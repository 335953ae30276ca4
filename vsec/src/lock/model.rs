//! Lockfile data model and (de)serialisation. Writing is atomic: temp file + rename.

use crate::deb::{Arch, DebVersion, PackageName};
use std::path::{Path, PathBuf};

/// Format version written into every lockfile; bump on incompatible changes.
pub const LOCK_FORMAT: u32 = 1;
/// The largest lockfile read: thousands of packages take a few MiB.
pub const MAX_LOCK_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot read lockfile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write lockfile {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid lockfile: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "{path}: lockfile format {found} is not supported (this vse reads format {LOCK_FORMAT}); re-run `vse lock`"
    )]
    Format { path: PathBuf, found: u32 },
}

/// A lockfile that cannot be read or parsed is the user's input; one that cannot be written
/// is the host failing us.
impl vse_exit::Classify for LockError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            LockError::Write { .. } => vse_exit::ErrorKind::Internal,
            LockError::Read { .. } | LockError::Parse { .. } | LockError::Format { .. } => {
                vse_exit::ErrorKind::InvalidInput
            }
        }
    }
}

/// Why a package is in the lock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reason {
    /// Named in the spec's package list (or `--add`).
    Requested,
    /// Required by a policy (its file name).
    Policy { policy: String },
    /// The kernel named by the spec.
    Kernel,
    /// Needed by the image builder itself: the initramfs runs on a static busybox.
    Initramfs,
    /// `Essential: yes`, or in the base variant's priority set.
    Base { variant: String },
    /// Pulled in by a relationship of another locked package.
    Dependency { of: PackageName },
}

/// The spec and policies the lock was made from, relative to the lockfile's directory.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceFiles {
    pub spec: PathBuf,
    #[serde(default)]
    pub policies: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockedRepository {
    /// Base URL of the archive (after any policy mirror rewrite), e.g. `http://mirror/debian`.
    pub url: String,
    pub suite: String,
    pub components: Vec<String>,
    /// The Release file's `Date:` field.
    pub release_date: String,
    /// SHA256 of the (In)Release file that was verified.
    pub release_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockedPackage {
    pub name: PackageName,
    pub version: DebVersion,
    pub architecture: Arch,
    /// Path relative to the repository URL (`pool/main/…/x.deb`).
    pub filename: String,
    pub size: u64,
    pub sha256: String,
    /// Index into [`Lockfile::repositories`].
    pub repository: usize,
    pub reason: Reason,
}

/// The lockfile (`vse.lock`): TOML, deterministic, and refused when written by a vse of
/// another format.
///
/// ```
/// use std::path::Path;
/// use vsec::deb::Arch;
/// use vsec::lock::{LOCK_FORMAT, Lockfile, SourceFiles};
/// let lock = Lockfile {
///     format: LOCK_FORMAT,
///     env_hash: "sha256:00".into(),
///     generator: "doc".into(),
///     architecture: Arch::new("amd64").unwrap(),
///     source: SourceFiles::default(),
///     repositories: vec![],
///     packages: vec![],
/// };
/// let text = lock.to_toml();
/// assert_eq!(Lockfile::from_toml(Path::new("vse.lock"), &text).unwrap(), lock);
/// let future = text.replace(&format!("format = {LOCK_FORMAT}"), "format = 99");
/// let e = Lockfile::from_toml(Path::new("vse.lock"), &future).unwrap_err();
/// assert!(e.to_string().contains("re-run `vse lock`"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lockfile {
    pub format: u32,
    /// Hash of the effective environment the lock was resolved for.
    pub env_hash: String,
    /// `vse <version>` that wrote it.
    pub generator: String,
    pub architecture: Arch,
    pub source: SourceFiles,
    pub repositories: Vec<LockedRepository>,
    /// Sorted by name, then architecture: determinism makes identical inputs byte-identical.
    pub packages: Vec<LockedPackage>,
}

impl Lockfile {
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("lockfile types always serialise to TOML")
    }

    pub fn from_toml(path: &Path, text: &str) -> Result<Self, LockError> {
        #[derive(serde::Deserialize)]
        struct Probe {
            format: u32,
        }
        let parse_err = |e: toml::de::Error| LockError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let probe: Probe = toml::from_str(text).map_err(parse_err)?;
        if probe.format != LOCK_FORMAT {
            return Err(LockError::Format {
                path: path.to_path_buf(),
                found: probe.format,
            });
        }
        toml::from_str(text).map_err(parse_err)
    }

    pub fn read(path: &Path) -> Result<Self, LockError> {
        let read_err = |source| LockError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = vse_base::read_input(path, MAX_LOCK_BYTES).map_err(read_err)?;
        if bytes.len() as u64 > MAX_LOCK_BYTES {
            return Err(read_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("larger than {} MiB: not a lockfile", MAX_LOCK_BYTES >> 20),
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            read_err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not UTF-8: not a lockfile",
            ))
        })?;
        Self::from_toml(path, &text)
    }

    /// Writes atomically: a crash never leaves a truncated lockfile behind.
    pub fn write(&self, path: &Path) -> Result<(), LockError> {
        let werr = |source| LockError::Write {
            path: path.to_path_buf(),
            source,
        };
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(werr)?;
        std::io::Write::write_all(&mut tmp, self.to_toml().as_bytes()).map_err(werr)?;
        tmp.as_file().sync_all().map_err(werr)?;
        tmp.persist(path).map_err(|e| werr(e.error))?;
        Ok(())
    }

    /// The package marked as the kernel, if any.
    pub fn kernel(&self) -> Option<&LockedPackage> {
        self.packages.iter().find(|p| p.reason == Reason::Kernel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Lockfile {
        Lockfile {
            format: LOCK_FORMAT,
            env_hash: "sha256:00".into(),
            generator: "vse test".into(),
            architecture: Arch::new("amd64").unwrap(),
            source: SourceFiles {
                spec: "min.vse.yaml".into(),
                policies: vec![],
            },
            repositories: vec![LockedRepository {
                url: "file:///srv/debian".into(),
                suite: "bookworm".into(),
                components: vec!["main".into()],
                release_date: "Sat, 10 May 2025 08:00:00 UTC".into(),
                release_sha256: "ab".into(),
            }],
            packages: vec![LockedPackage {
                name: PackageName::new("busybox-static").unwrap(),
                version: DebVersion::parse("1:1.35.0-4+b3").unwrap(),
                architecture: Arch::new("amd64").unwrap(),
                filename: "pool/main/b/busybox/busybox-static_1.35.0-4+b3_amd64.deb".into(),
                size: 1,
                sha256: "cd".into(),
                repository: 0,
                reason: Reason::Dependency {
                    of: PackageName::new("bash").unwrap(),
                },
            }],
        }
    }

    #[test]
    fn round_trips_through_toml_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vse.lock");
        let lock = sample();
        lock.write(&path).unwrap();
        assert_eq!(Lockfile::read(&path).unwrap(), lock);
    }

    #[test]
    fn rejects_other_formats_with_a_hint() {
        let text = sample().to_toml().replace("format = 1", "format = 99");
        let e = Lockfile::from_toml(Path::new("x.lock"), &text).unwrap_err();
        assert!(e.to_string().contains("re-run `vse lock`"), "{e}");
    }
}
