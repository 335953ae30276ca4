//! What a launch may ask for under the stacked policies: refused before anything starts.

use control::migrate::{MigrationConfig, PolicyMapError, migration_config};
use v2m::PluginKind;
use vse_exit::{Classify, ErrorKind};
use vsec::launch::{LaunchRuleError, LaunchRules};
use vsec::units::Hypervisor;

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Rule(#[from] LaunchRuleError),
    #[error("policy: {0}")]
    Migration(#[source] PolicyMapError),
    #[error(
        "--hypervisor libvirt: the policy's migration section needs VMs the node agents can live-migrate themselves; hint: use --hypervisor qemu (or auto)"
    )]
    LibvirtMigration,
    #[error("--memory must be at least 128 (MiB) and --fanout at least 1")]
    TooSmall,
    #[error(
        "--node-memory is the simulation mode of nodes that share one machine (local:N, or a test cluster of namespace nodes with VSE_NODES_SHARE_MACHINE=1); real nodes are sampled through their own /proc; hint: drop it"
    )]
    NodeMemoryNotLocal,
    #[error("--node-memory {node} MiB cannot hold {vms} VM(s) of {vm} MiB")]
    NodeMemoryTooSmall { node: u64, vms: u32, vm: u64 },
    #[error(
        "node {host}: the batch system lets this job use {job} MiB there, less than its {vms} VM(s) need: {vms} x ({vm} MiB + {overhead} MiB for the hypervisor) = {need} MiB; hint: ask for more memory (salloc/sbatch --mem or --mem-per-cpu) or launch smaller VMs (--memory, --vms-per-node)",
        need = u64::from(*vms) * (vm + overhead)
    )]
    JobMemoryTooSmall {
        host: String,
        job: u64,
        vms: u32,
        vm: u64,
        overhead: u64,
    },
}

impl Classify for RequestError {
    fn kind(&self) -> ErrorKind {
        match self {
            RequestError::Rule(e) => e.kind(),
            RequestError::Migration(e) => e.kind(),
            _ => ErrorKind::InvalidInput,
        }
    }
}

/// The sizes a launch asks for.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub vcpus: u32,
    pub memory_mib: u64,
    pub vms_per_node: u32,
    pub fanout: u32,
    /// Simulation mode: each node's memory cgroup (local allocations only).
    pub node_memory_mib: Option<u64>,
    /// All agents share this machine (`local[:N]`, or nodes said to share it).
    pub local: bool,
}

/// Requests that cannot work, refused before anything starts.
pub fn check_request(rules: &LaunchRules, s: &Sizes) -> Result<(), RequestError> {
    rules.check_vm(s.vcpus, s.memory_mib)?;
    if s.memory_mib < 128 || s.fanout == 0 {
        return Err(RequestError::TooSmall);
    }
    if s.node_memory_mib.is_some() && !s.local {
        return Err(RequestError::NodeMemoryNotLocal);
    }
    match s.node_memory_mib {
        Some(node) if node < s.memory_mib * u64::from(s.vms_per_node) => {
            Err(RequestError::NodeMemoryTooSmall {
                node,
                vms: s.vms_per_node,
                vm: s.memory_mib,
            })
        }
        _ => Ok(()),
    }
}

/// Refuses, before any agent starts, VMs that the job's memory on a node cannot hold (the
/// batch system's cgroup would kill them mid-job): each node's VMs with their hypervisors.
pub fn check_job_memory(nodes: &[agents::alloc::NodeSlot], s: &Sizes) -> Result<(), RequestError> {
    let overhead = vmhost::fit::HYPERVISOR_OVERHEAD_MIB;
    let need = u64::from(s.vms_per_node) * (s.memory_mib + overhead);
    match nodes
        .iter()
        .find_map(|n| n.memory_mib.filter(|m| *m < need).map(|m| (n, m)))
    {
        Some((n, job)) => Err(RequestError::JobMemoryTooSmall {
            host: n.host.clone(),
            job,
            vms: s.vms_per_node,
            vm: s.memory_mib,
            overhead,
        }),
        None => Ok(()),
    }
}

/// The hypervisor the nodes use (`auto`: each node's first available one) and the migration
/// daemon's settings, both as the policies allow.
pub fn hypervisor_and_migration(
    rules: &LaunchRules,
    wanted: Option<Hypervisor>,
) -> Result<(Option<PluginKind>, Option<MigrationConfig>), RequestError> {
    let chosen = rules.hypervisor(wanted)?;
    let migration = (rules.migration.as_ref())
        .map(migration_config)
        .transpose()
        .map_err(RequestError::Migration)?;
    if migration.is_none() {
        return Ok((chosen.map(plugin_kind), None));
    }
    if chosen == Some(Hypervisor::Libvirt) {
        return Err(RequestError::LibvirtMigration);
    }
    // VMs the daemon may move are QEMU's: node agents migrate them with V2M's QEMU plugin.
    Ok((Some(PluginKind::Qemu), migration))
}

/// The V2M plugin of a policy's hypervisor name.
fn plugin_kind(h: Hypervisor) -> PluginKind {
    match h {
        Hypervisor::Qemu => PluginKind::Qemu,
        Hypervisor::Libvirt => PluginKind::Libvirt,
        Hypervisor::Xen => PluginKind::Xen,
        Hypervisor::Palacios => PluginKind::Palacios,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agents::alloc::NodeSlot;

    fn sizes(memory_mib: u64, vms_per_node: u32) -> Sizes {
        Sizes {
            vcpus: 1,
            memory_mib,
            vms_per_node,
            fanout: 2,
            node_memory_mib: None,
            local: false,
        }
    }

    #[test]
    fn a_node_whose_job_memory_cannot_hold_its_vms_is_named_with_the_numbers() {
        let node = |host: &str, memory_mib| NodeSlot {
            memory_mib,
            ..NodeSlot::new(host, 2)
        };
        let nodes = [
            node("n1", Some(4096)),
            node("n2", Some(1000)),
            node("n3", None),
        ];
        assert!(check_job_memory(&nodes, &sizes(256, 2)).is_ok());
        let e = check_job_memory(&nodes, &sizes(512, 2)).unwrap_err();
        let overhead = vmhost::fit::HYPERVISOR_OVERHEAD_MIB;
        let need = 2 * (512 + overhead);
        assert!(
            e.to_string().starts_with(&format!(
                "node n2: the batch system lets this job use 1000 MiB there, less than its 2 VM(s) need: 2 x (512 MiB + {overhead} MiB for the hypervisor) = {need} MiB"
            )),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        // Unbounded nodes (no batch memory limit) hold anything.
        assert!(check_job_memory(&[node("n3", None)], &sizes(65536, 8)).is_ok());
    }
}
