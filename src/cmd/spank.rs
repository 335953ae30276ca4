//! `vse spank PHASE` (hidden): what the Slurm SPANK plugin (`plugins/spank`) runs in srun,
//! slurmstepd and each task. The work is in the vse-spank crate; building is the image store's
//! (`imgbuild::pipeline`), lent to it here.

use crate::exit::{Failure, is_invalid};
use anyhow::{Result, anyhow};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vse_spank::node::{Host, HostError};
use vse_spank::{Phase, SpankError};

pub fn run(phase: Phase) -> Result<ExitCode> {
    let done = |r: Result<(), SpankError>| r.map(|_| ExitCode::SUCCESS).map_err(err);
    match phase {
        Phase::Check(a) => done(vse_spank::check(&a).map(drop)),
        Phase::Node(a) => done(vse_spank::node::serve(a, &Binary)),
        Phase::Task(a) => vse_spank::task::run(a).map(ExitCode::from).map_err(err),
        Phase::Stop(a) => done(vse_spank::stop::stop(&a.dir)),
        Phase::Read(a) => done(vse_spank::read_here(&a).map(|json| println!("{json}"))),
    }
}

fn err(e: SpankError) -> anyhow::Error {
    if e.is_invalid() {
        Failure::invalid(e.to_string()).into()
    } else {
        anyhow!(e)
    }
}

fn host_err(e: anyhow::Error) -> HostError {
    HostError {
        message: format!("{e:#}"),
        invalid: is_invalid(&e),
    }
}

struct Binary;

impl Host for Binary {
    fn image_for_spec(&self, spec: &Path, policies: &[PathBuf]) -> Result<PathBuf, HostError> {
        let env = super::envload::load_env(spec, policies).map_err(host_err)?;
        super::build::image_for_spec(spec, policies, &env, true).map_err(host_err)
    }
}
