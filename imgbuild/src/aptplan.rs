//! A [`BuildPlan`] from apt's own choice of packages (`apt-get install --print-uris` against
//! an empty dpkg status), for tests, benchmarks and CI before or beside `vse lock`.
//! Downloads still come from the machine's configured mirror.

use crate::plan::{BuildPlan, PlannedPackage};
use sha2::{Digest, Sha256};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum AptPlanError {
    #[error("cannot run apt-get: {0}")]
    Spawn(std::io::Error),
    #[error("apt-get could not choose packages for {pkgs:?}: {stderr}")]
    Apt { pkgs: Vec<String>, stderr: String },
    #[error("unexpected apt-get output line: {0}")]
    Parse(String),
}

/// The Debian `Priority: required` set: dpkg, dash, coreutils… the base of a real system.
pub const REQUIRED: &str = "?priority(required)";

/// Resolves `pkgs` (names or apt patterns) with apt; `kernel` marks the kernel package.
pub fn plan_from_apt(pkgs: &[&str], epoch: u64) -> Result<BuildPlan, AptPlanError> {
    let status = tempfile::NamedTempFile::new().map_err(AptPlanError::Spawn)?;
    let out = Command::new("apt-get")
        .args(["install", "--print-uris", "-qq", "--no-install-recommends"])
        .args([
            "-o",
            "Acquire::ForceHash=SHA256",
            "-o",
            "Debug::NoLocking=1",
        ])
        .arg("-o")
        .arg(format!("Dir::State::status={}", status.path().display()))
        .args(pkgs)
        .output()
        .map_err(AptPlanError::Spawn)?;
    if !out.status.success() {
        return Err(AptPlanError::Apt {
            pkgs: pkgs.iter().map(|s| s.to_string()).collect(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut packages = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('\'')) {
        let bad = || AptPlanError::Parse(line.to_string());
        let mut f = line.split_whitespace();
        let url = f.next().ok_or_else(bad)?.trim_matches('\'');
        let file = f.next().ok_or_else(bad)?;
        let size = f.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let sha256 = f
            .next()
            .and_then(|s| s.strip_prefix("SHA256:"))
            .ok_or_else(bad)?;
        let stem = file.strip_suffix(".deb").ok_or_else(bad)?;
        let mut nv = stem.splitn(3, '_');
        let name = nv.next().ok_or_else(bad)?.to_string();
        let version = nv.next().ok_or_else(bad)?.replace("%3a", ":");
        let kernel = name.starts_with("linux-image-")
            && name.chars().nth(12).is_some_and(|c| c.is_ascii_digit());
        packages.push(PlannedPackage {
            name,
            version,
            url: url.to_string(),
            size,
            sha256: sha256.to_ascii_lowercase(),
            kernel,
        });
    }
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    let mut h = Sha256::new();
    for p in &packages {
        h.update(format!("{} {} {}\n", p.name, p.version, p.sha256));
    }
    Ok(BuildPlan {
        lock_hash: format!("sha256:{}", hex::encode(h.finalize())),
        epoch,
        packages,
    })
}
