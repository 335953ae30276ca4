//! apt as an independent judge and baseline: a dpkg status file for a package set, and
//! `apt-get` run in a private sandbox (its own status, cache and state; never the host's
//! dpkg database, never a lock). Used by the apt-oracle tests and `vse bench resolve`.

use crate::deb::Alternatives;
use crate::index::{MultiArch, Package};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why an apt run gave no answer, or apt's verdict against a package set.
#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run apt-get: {0}")]
    Spawn(#[source] std::io::Error),
    /// apt-get failed; its stdout and stderr.
    #[error("{0}")]
    Failed(String),
    /// `apt-get check` found unmet dependencies or broken packages; its output.
    #[error("{0}")]
    Broken(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AptError + '_ {
    move |source| AptError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A directory holding apt's private cache and state for one series of runs.
#[derive(Debug, Clone)]
pub struct AptSandbox {
    pub dir: PathBuf,
}

fn groups(gs: &[Alternatives]) -> String {
    gs.iter()
        .map(|g| {
            g.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A dpkg status file claiming exactly these packages are installed.
pub fn dpkg_status(pkgs: &[&Package]) -> String {
    let mut s = String::new();
    for p in pkgs {
        s.push_str(&format!(
            "Package: {}\nStatus: install ok installed\nPriority: optional\nVersion: {}\nArchitecture: {}\n",
            p.name, p.version, p.architecture
        ));
        if p.essential {
            s.push_str("Essential: yes\n");
        }
        let ma = match p.multi_arch {
            MultiArch::No => None,
            MultiArch::Same => Some("same"),
            MultiArch::Foreign => Some("foreign"),
            MultiArch::Allowed => Some("allowed"),
        };
        if let Some(m) = ma {
            s.push_str(&format!("Multi-Arch: {m}\n"));
        }
        for (field, gs) in [
            ("Pre-Depends", &p.pre_depends),
            ("Depends", &p.depends),
            ("Conflicts", &p.conflicts),
            ("Breaks", &p.breaks),
            ("Replaces", &p.replaces),
        ] {
            if !gs.is_empty() {
                s.push_str(&format!("{field}: {}\n", groups(gs)));
            }
        }
        if !p.provides.is_empty() {
            let pv: Vec<String> = p.provides.iter().map(|r| r.to_string()).collect();
            s.push_str(&format!("Provides: {}\n", pv.join(", ")));
        }
        s.push_str("Description: locked by vse\n\n");
    }
    s
}

impl AptSandbox {
    /// apt with its own private state and cache under `dir`, never the host's.
    pub fn command(&self, status: &Path) -> Command {
        let dir = self.dir.as_path();
        let _ = std::fs::create_dir_all(dir.join("cache"));
        let mut c = Command::new("apt-get");
        c.env("LC_ALL", "C")
            .arg("-o")
            .arg(format!("Dir::State::status={}", status.display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}/cache", dir.display()))
            .arg("-o")
            .arg(format!(
                "Dir::Cache::pkgcache={}/cache/pkgcache.bin",
                dir.display()
            ))
            .arg("-o")
            .arg(format!(
                "Dir::Cache::srcpkgcache={}/cache/srcpkgcache.bin",
                dir.display()
            ))
            .arg("-o")
            .arg(format!(
                "Dir::State::extended_states={}/extended_states",
                dir.display()
            ))
            .arg("-o")
            .arg("Debug::NoLocking=1")
            .arg("-o")
            .arg("APT::Install-Recommends=false");
        c
    }

    /// `apt-get install -s` against an empty status: the names apt would install.
    pub fn simulate(&self, names: &[String]) -> Result<Vec<String>, AptError> {
        let dir = self.dir.as_path();
        let empty = dir.join("empty-status");
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        std::fs::write(&empty, "").map_err(io_err(&empty))?;
        let out = self
            .command(&empty)
            .arg("-s")
            .arg("install")
            .args(names)
            .output()
            .map_err(AptError::Spawn)?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(AptError::Failed(format!(
                "{}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(text
            .lines()
            .filter_map(|l| l.strip_prefix("Inst "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect())
    }

    /// `apt-get check` on a status file holding `pkgs`: Ok when apt finds nothing broken.
    pub fn check(&self, pkgs: &[&Package]) -> Result<(), AptError> {
        let dir = self.dir.as_path();
        let status = dir.join("lock-status");
        std::fs::write(&status, dpkg_status(pkgs)).map_err(io_err(&status))?;
        let out = self
            .command(&status)
            .arg("check")
            .output()
            .map_err(AptError::Spawn)?;
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && !all.contains("nmet") && !all.contains("broken") {
            Ok(())
        } else {
            Err(AptError::Broken(all))
        }
    }
}
