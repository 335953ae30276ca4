//! The spec and policies, loaded by `imgbuild::pipeline`; this shows their problems as
//! `vse check` does (every diagnostic on stderr, then a one-line summary, exit code 2).

use anyhow::Result;
use imgbuild::pipeline::{EnvError, PipelineError};
use std::path::{Path, PathBuf};
use vsec::env::EffectiveEnv;
use vsec::policy::Policy;
use vsec::yaml::Diagnostics;

/// The spec merged with the stacked policies; problems printed.
pub fn load_env(spec: &Path, policies: &[PathBuf]) -> Result<EffectiveEnv> {
    imgbuild::pipeline::load_env(spec, policies).map_err(|e| shown(e.into()))
}

/// The policies, parsed; their problems collected.
pub fn load_policies(paths: &[PathBuf]) -> Result<Result<Vec<Policy>, Diagnostics>> {
    Ok(imgbuild::pipeline::load_policies(paths)?)
}

/// Prints `problems` of `what` to stderr and makes the error that ends the command.
pub fn reported(what: &dyn std::fmt::Display, problems: Diagnostics) -> anyhow::Error {
    shown(EnvError::problems(what, problems).into())
}

/// A pipeline error, after printing the diagnostics it carries.
pub fn shown(e: PipelineError) -> anyhow::Error {
    if let Some(d) = e.diagnostics() {
        eprintln!("{d}");
    }
    e.into()
}
