//! A spec and its stacked policies loaded and merged, every problem of every file collected
//! (not just the first); the policies alone for `vse launch IMAGE`.

use std::path::{Path, PathBuf};
use thiserror::Error;
use vse_exit::{Classify, ErrorKind};
use vsec::env::EffectiveEnv;
use vsec::policy::Policy;
use vsec::yaml::{Diagnostics, YamlError};

#[derive(Debug, Error)]
pub enum EnvError {
    /// A file could not be read at all.
    #[error(transparent)]
    Read(YamlError),
    /// The files' problems, all of them; the CLI prints them before this summary.
    #[error("{what}: {} {} found; hint: `vse check` explains each", problems.len(), noun(problems.len()))]
    Problems { what: String, problems: Diagnostics },
}

fn noun(n: usize) -> &'static str {
    if n == 1 { "problem" } else { "problems" }
}

impl EnvError {
    /// `problems` of `what` (a spec, or a list of policies).
    pub fn problems(what: impl std::fmt::Display, problems: Diagnostics) -> Self {
        EnvError::Problems {
            what: what.to_string(),
            problems,
        }
    }

    /// The diagnostics to show the user (file:line:column each), if that is what this is.
    pub fn diagnostics(&self) -> Option<&Diagnostics> {
        match self {
            EnvError::Problems { problems, .. } => Some(problems),
            EnvError::Read(_) => None,
        }
    }
}

impl Classify for EnvError {
    fn kind(&self) -> ErrorKind {
        match self {
            EnvError::Read(e) => e.kind(),
            EnvError::Problems { problems, .. } => problems.kind(),
        }
    }
}

/// Parses and merges; `Ok(Err(_))` holds every problem of every file.
pub fn merge_files(
    spec: &Path,
    policies: &[PathBuf],
) -> Result<Result<EffectiveEnv, Diagnostics>, YamlError> {
    let mut problems = Diagnostics::default();
    let spec = collect(vsec::spec::load(spec), &mut problems)?;
    let loaded = load_all(policies, &mut problems)?;
    Ok(match spec {
        Some(spec) if problems.is_empty() => vsec::merge::merge(&spec, &loaded),
        _ => Err(problems),
    })
}

/// As [`merge_files`], the problems as an error.
pub fn load_env(spec: &Path, policies: &[PathBuf]) -> Result<EffectiveEnv, EnvError> {
    merge_files(spec, policies)
        .map_err(EnvError::Read)?
        .map_err(|problems| EnvError::problems(spec.display(), problems))
}

/// The policies, parsed; their problems collected.
pub fn load_policies(paths: &[PathBuf]) -> Result<Result<Vec<Policy>, Diagnostics>, YamlError> {
    let mut problems = Diagnostics::default();
    let loaded = load_all(paths, &mut problems)?;
    Ok(problems.into_result(loaded))
}

fn load_all(paths: &[PathBuf], problems: &mut Diagnostics) -> Result<Vec<Policy>, YamlError> {
    let mut loaded = Vec::new();
    for p in paths {
        if let Some(pol) = collect(vsec::policy::load(p), problems)? {
            loaded.push(pol);
        }
    }
    Ok(loaded)
}

/// Content problems are collected so that all are reported at once; an unreadable file ends
/// the load.
fn collect<T>(r: Result<T, YamlError>, problems: &mut Diagnostics) -> Result<Option<T>, YamlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(YamlError::Invalid(d)) => {
            problems.extend(d);
            Ok(None)
        }
        Err(e @ YamlError::Read { .. }) => Err(e),
    }
}

/// A spec is YAML; a lock is TOML starting with `format = …`.
pub fn is_spec(p: &Path) -> bool {
    match p.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml") => true,
        Some("lock" | "toml") => false,
        // The start tells; the rest (of a file that may not even end) is read by the caller.
        _ => vse_base::read_input(p, 4096)
            .map(|b| {
                !String::from_utf8_lossy(&b)
                    .trim_start()
                    .starts_with("format")
            })
            .unwrap_or(false),
    }
}

/// `path` relative to `dir` (both made absolute first), as the lockfile records its spec and
/// policies: the lock stays valid when the whole tree is moved.
pub fn relative_to(path: &Path, dir: &Path) -> PathBuf {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (p, d) = (abs(path), abs(dir));
    let (pc, dc): (Vec<_>, Vec<_>) = (p.components().collect(), d.components().collect());
    let common = pc.iter().zip(&dc).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..dc.len() {
        out.push("..");
    }
    for c in &pc[common..] {
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_walk_up_and_down() {
        assert_eq!(
            relative_to(Path::new("/a/specs/x.yaml"), Path::new("/a/out")),
            Path::new("../specs/x.yaml")
        );
        assert_eq!(
            relative_to(Path::new("/a/x.yaml"), Path::new("/a")),
            Path::new("x.yaml")
        );
    }

    #[test]
    fn specs_are_told_from_locks_by_name_then_content() {
        let dir = tempfile::tempdir().unwrap();
        assert!(is_spec(Path::new("x.vse.yaml")));
        assert!(!is_spec(Path::new("x.lock")));
        let lock = dir.path().join("noext");
        std::fs::write(&lock, "format = 1\n").unwrap();
        assert!(!is_spec(&lock));
        let spec = dir.path().join("spec");
        std::fs::write(&spec, "version: 1\n").unwrap();
        assert!(is_spec(&spec));
        assert!(!is_spec(&dir.path().join("missing")));
    }

    #[test]
    fn the_summary_counts_the_problems() {
        let e = EnvError::problems("s.yaml", Diagnostics::default());
        assert_eq!(
            e.to_string(),
            "s.yaml: 0 problems found; hint: `vse check` explains each"
        );
    }
}
