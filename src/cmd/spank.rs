//! `vse spank PHASE` (hidden): what the Slurm SPANK plugin (`plugins/spank`) runs in srun,
//! slurmstepd and each task. The work is in the vse-spank crate; booting and building are
//! `vse run`'s and `vse build`'s, lent to it here.

use crate::exit::{Failure, is_invalid};
use anyhow::{Result, anyhow};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use v2m::Vm;
use v2m::qemu::AccelPolicy;
use vse_spank::node::{BootedVm, Host, HostError, VmRequest};
use vse_spank::{Accel, Phase, SpankError};

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

    fn boot(&self, r: &VmRequest<'_>) -> Result<BootedVm, HostError> {
        let accel = match r.accel {
            Accel::Auto => AccelPolicy::Auto,
            Accel::Kvm => AccelPolicy::Kvm,
            Accel::Tcg => AccelPolicy::Tcg,
        };
        let m = super::run::load_manifest(r.image).map_err(host_err)?;
        let qemu = Path::new("qemu-system-x86_64");
        let mut b = super::run::boot(&m, r.image, r.vcpus, r.memory_mib, accel, r.run_dir, qemu)
            .map_err(host_err)?;
        let agent_socket = b.vm.agent_socket().map(Path::to_path_buf);
        let pid = b.vm.status().ok().and_then(|s| s.pid);
        Ok(BootedVm {
            agent_socket: agent_socket.ok_or_else(|| host_err(anyhow!("the VM has no agent")))?,
            pid,
            handle: Box::new(b),
        })
    }
}
