//! Loading a spec and its stacked policies into an effective environment, shared by the
//! commands that start from a spec (`check`, `lock`, `build`), and the policies alone for
//! `vse launch IMAGE`.

use crate::exit::Failure;
use anyhow::Result;
use std::path::{Path, PathBuf};
use vsec::env::EffectiveEnv;
use vsec::policy::Policy;
use vsec::yaml::{Diagnostics, YamlError};

/// Parses and merges; every problem of every file is collected, not just the first.
pub fn merge_files(spec: &Path, policies: &[PathBuf]) -> Result<Result<EffectiveEnv, Diagnostics>> {
    let mut problems = Diagnostics::default();
    let spec = collect(vsec::spec::load(spec), &mut problems)?;
    let loaded = load_all(policies, &mut problems)?;
    Ok(match spec {
        Some(spec) if problems.is_empty() => vsec::merge::merge(&spec, &loaded),
        _ => Err(problems),
    })
}

/// As [`merge_files`], printing the problems to stderr and failing with exit code 2.
pub fn load_env(spec: &Path, policies: &[PathBuf]) -> Result<EffectiveEnv> {
    merge_files(spec, policies)?.map_err(|problems| reported(&spec.display(), problems))
}

/// The policies, parsed; their problems collected.
pub fn load_policies(paths: &[PathBuf]) -> Result<Result<Vec<Policy>, Diagnostics>> {
    let mut problems = Diagnostics::default();
    let loaded = load_all(paths, &mut problems)?;
    Ok(problems.into_result(loaded))
}

/// Prints `problems` of `what` to stderr, as `vse check` does, and makes the error that ends
/// the command with exit code 2.
pub fn reported(what: &dyn std::fmt::Display, problems: Diagnostics) -> anyhow::Error {
    eprintln!("{problems}");
    let n = problems.len();
    let noun = if n == 1 { "problem" } else { "problems" };
    Failure::reword(
        &problems,
        format!("{what}: {n} {noun} found; hint: `vse check` explains each"),
    )
    .into()
}

fn load_all(paths: &[PathBuf], problems: &mut Diagnostics) -> Result<Vec<Policy>> {
    let mut loaded = Vec::new();
    for p in paths {
        if let Some(pol) = collect(vsec::policy::load(p), problems)? {
            loaded.push(pol);
        }
    }
    Ok(loaded)
}

/// Input problems are collected (so all are reported at once); an unreadable file ends the
/// command (it is input too: [`YamlError`] says so).
fn collect<T>(r: Result<T, YamlError>, problems: &mut Diagnostics) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(YamlError::Invalid(d)) => {
            problems.extend(d);
            Ok(None)
        }
        Err(e @ YamlError::Read { .. }) => Err(e.into()),
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
    use super::relative_to;
    use std::path::Path;

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
}
