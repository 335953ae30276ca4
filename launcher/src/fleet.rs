//! The migration daemon's hands on real VMs: [`LiveMigrator`] and [`VmLocator`] over the V2M
//! QEMU plugin. A "node" is one QEMU plugin instance with its own run root: on a cluster the
//! node's agent holds it; on one machine (tests, `vse bench migrate`) several run roots stand
//! for several nodes. VMs boot and move with vmhost's steps: the destination is prepared with
//! `-incoming` on the target node, the state is sent with the configured bandwidth/downtime
//! limits, and only then is the handle swapped, so on any failure the source keeps running and
//! the half-made destination is killed on drop. The guest agent link follows the VM.

use control::migrate::{LiveMigrator, MigrateError};
use control::state::{LocateError, VmLocator};
use monitor::{NodeName, VmId};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use v2m::qemu::{QemuConfig, QemuPlugin};
use v2m::{MigrationParams, MigrationReport, Plugin, Profile, Vm, VmName, VmState};
use vmhost::{BootOptions, Incoming, RunningVm};
use vse_guest_agent::{GuestLink, LinkError, LinkOptions};

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("unknown node {0}: add it with QemuFleet::add_node first")]
    UnknownNode(String),
    #[error("VM {0} is not known to this fleet")]
    UnknownVm(String),
    #[error("VM {0} already exists in this fleet")]
    Duplicate(String),
    #[error("VM id {vm} is not a valid hypervisor VM name: {source}")]
    BadName {
        vm: String,
        source: v2m::names::NameError,
    },
    #[error("VM {vm} on {node}: {source}")]
    Boot {
        vm: String,
        node: String,
        #[source]
        source: Box<vmhost::BootError>,
    },
    #[error("VM {vm} on {node}: {source}")]
    V2m {
        vm: String,
        node: String,
        #[source]
        source: Box<v2m::V2mError>,
    },
    #[error("VM {vm} runs on {on}, not on {from}")]
    WrongNode {
        vm: String,
        on: String,
        from: String,
    },
    #[error("migrating to {to}: {source}")]
    Migrate {
        to: String,
        #[source]
        source: Box<vmhost::MigrateError>,
    },
    #[error("no randomness for the migration key: {0}")]
    Random(String),
    #[error("reconnecting the guest agent on {node}: {source}")]
    Reattach { node: String, source: LinkError },
    #[error("VM {vm} runs on several nodes at once ({}); refusing to guess", nodes.join(", "))]
    Ambiguous { vm: String, nodes: Vec<String> },
}

struct Placed {
    node: NodeName,
    vm: RunningVm,
}

/// One migration as QEMU measured it, plus where it went.
#[derive(Debug, Clone)]
pub struct MigrationRecord {
    pub vm: VmId,
    pub from: NodeName,
    pub to: NodeName,
    pub report: MigrationReport,
    /// From the request to the destination running (prepare + send + finish).
    pub wall_ms: u64,
}

pub struct QemuFleet {
    nodes: HashMap<NodeName, QemuPlugin>,
    /// Nodes whose share of the machine is a cgroup: their hypervisor processes go there.
    cgroups: HashMap<NodeName, PathBuf>,
    vms: HashMap<VmId, Placed>,
    params: MigrationParams,
    listen: IpAddr,
    finish_timeout: Duration,
    records: Vec<MigrationRecord>,
    /// Incoming VMs started ahead of their move (see `LiveMigrator::prepare`), by VM.
    prepared: HashMap<VmId, Prepared>,
}

/// A destination made ready while the ranks reached a barrier.
struct Prepared {
    to: NodeName,
    incoming: Incoming,
    key: v2m::MigrationKey,
}

/// The hypervisor name of a VM: the VmId, which must also satisfy V2M's stricter alphabet.
pub fn vm_name(vm: &VmId) -> Result<VmName, FleetError> {
    vm.as_str().parse().map_err(|source| FleetError::BadName {
        vm: vm.to_string(),
        source,
    })
}

impl QemuFleet {
    /// `params`: the limits of every migration (see `MigrationConfig::params`); `listen`: the
    /// address destinations listen on (loopback on one machine).
    pub fn new(params: MigrationParams, listen: IpAddr) -> Self {
        Self {
            nodes: HashMap::new(),
            cgroups: HashMap::new(),
            vms: HashMap::new(),
            params,
            listen,
            finish_timeout: Duration::from_secs(120),
            records: Vec::new(),
            prepared: HashMap::new(),
        }
    }

    pub fn add_node(&mut self, node: NodeName, cfg: QemuConfig) {
        self.nodes.insert(node, QemuPlugin::new(cfg));
    }

    /// A node whose VMs run inside the cgroup directory `cgroup` (v1 or v2): its memory view
    /// then includes exactly its own VMs and whatever else runs there.
    pub fn add_node_in_cgroup(&mut self, node: NodeName, cfg: QemuConfig, cgroup: PathBuf) {
        self.cgroups.insert(node.clone(), cgroup);
        self.add_node(node, cfg);
    }

    fn plugin(&self, node: &NodeName) -> Result<&QemuPlugin, FleetError> {
        self.nodes
            .get(node)
            .ok_or_else(|| FleetError::UnknownNode(node.to_string()))
    }

    /// Boots `profile` on `node` and connects its guest agent with `link` (whose barrier
    /// lines go where it says); the fleet owns the VM (killed on drop).
    pub fn start(
        &mut self,
        id: VmId,
        node: &NodeName,
        profile: Profile,
        link: LinkOptions,
    ) -> Result<(), FleetError> {
        if self.vms.contains_key(&id) {
            return Err(FleetError::Duplicate(id.to_string()));
        }
        let opts = BootOptions {
            templates: None,
            scratch_prefix: "fleet".into(),
            scratch_parent: None,
            cgroup: self.cgroups.get(node).cloned(),
            agent: link,
        };
        let vm = vmhost::boot_profile(self.plugin(node)?, profile, &opts).map_err(|e| {
            FleetError::Boot {
                vm: id.to_string(),
                node: node.to_string(),
                source: Box::new(e),
            }
        })?;
        self.vms.insert(
            id,
            Placed {
                node: node.clone(),
                vm,
            },
        );
        Ok(())
    }

    fn placed(&self, id: &VmId) -> Result<&Placed, FleetError> {
        self.vms
            .get(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))
    }

    pub fn vm(&self, id: &VmId) -> Result<&dyn Vm, FleetError> {
        Ok(self.placed(id)?.vm.vm())
    }

    pub fn vm_mut(&mut self, id: &VmId) -> Result<&mut dyn Vm, FleetError> {
        Ok(self
            .vms
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))?
            .vm
            .vm_mut())
    }

    pub fn node_of(&self, id: &VmId) -> Result<&NodeName, FleetError> {
        Ok(&self.placed(id)?.node)
    }

    /// The hypervisor process (host view of the VM: RSS and CPU time come from it).
    pub fn pid(&self, id: &VmId) -> Option<u32> {
        Some(self.vms.get(id)?.vm.pid())
    }

    /// The guest agent link that follows the VM through its migrations.
    pub fn link(&self, id: &VmId) -> Option<&GuestLink> {
        Some(self.vms.get(id)?.vm.link())
    }

    /// Every migration done through this fleet, oldest first.
    pub fn records(&self) -> &[MigrationRecord] {
        &self.records
    }

    /// Stops every VM (gracefully, then by force) and returns how many were stopped.
    pub fn shutdown(&mut self, grace: Duration) -> usize {
        self.vms
            .drain()
            .filter_map(|(_, mut p)| p.vm.stop(grace).ok())
            .count()
    }

    /// Starts `id`'s incoming VM on `to`, with a fresh key: only this fleet's source can hand
    /// the destination its state.
    fn incoming(&self, id: &VmId, to: &NodeName) -> Result<Prepared, FleetError> {
        let placed = self.placed(id)?;
        let dest = self.plugin(to)?;
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| FleetError::Random(e.to_string()))?;
        let key = v2m::MigrationKey::new(key);
        let incoming = Incoming::prepare(
            dest,
            placed.vm.profile(),
            self.listen,
            self.cgroups.get(to).map(PathBuf::as_path),
            Some(&key),
        )
        .map_err(|source| FleetError::Migrate {
            to: to.to_string(),
            source: Box::new(source),
        })?;
        Ok(Prepared {
            to: to.clone(),
            incoming,
            key,
        })
    }

    fn migrate_one(
        &mut self,
        id: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<MigrationRecord, FleetError> {
        let started = std::time::Instant::now();
        let placed = self.placed(id)?;
        if &placed.node != from {
            return Err(FleetError::WrongNode {
                vm: id.to_string(),
                on: placed.node.to_string(),
                from: from.to_string(),
            });
        }
        let moving = |source| FleetError::Migrate {
            to: to.to_string(),
            source: Box::new(source),
        };
        // Dropped (and killed) on any early return below: no half-made VM survives a failure.
        let Prepared { incoming, key, .. } = match self.prepared.remove(id) {
            Some(p) if &p.to == to => p,
            _ => self.incoming(id, to)?,
        };
        let placed = self
            .vms
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))?;
        let report = vmhost::send(
            placed.vm.vm_mut(),
            incoming.addr(),
            &self.params,
            Some(&key),
        )
        .map_err(moving)?;
        let arrived = incoming.finish(self.finish_timeout).map_err(moving)?;
        // The VM runs on the destination whether or not its link reattaches: keep it there.
        let (mut moved, linked) = arrived.reattach(placed.vm.link().clone());
        moved.set_overlay(placed.vm.take_overlay());
        // The source QEMU stopped itself after the handover; dropping its handle reaps it.
        drop(std::mem::replace(&mut placed.vm, moved));
        placed.node = to.clone();
        linked.map_err(|source| FleetError::Reattach {
            node: to.to_string(),
            source,
        })?;
        Ok(MigrationRecord {
            vm: id.clone(),
            from: from.clone(),
            to: to.clone(),
            report,
            wall_ms: started.elapsed().as_millis() as u64,
        })
    }
}

impl LiveMigrator for QemuFleet {
    fn prepare(&mut self, vm: &VmId, from: &NodeName, to: &NodeName) {
        // Best effort: a failure here recurs, and is reported, when the move is made.
        if self.node_of(vm).is_ok_and(|n| n == from)
            && let Ok(p) = self.incoming(vm, to)
        {
            self.prepared.insert(vm.clone(), p);
        }
    }

    fn abandon(&mut self, vm: &VmId) {
        self.prepared.remove(vm);
    }

    fn live_migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), MigrateError> {
        let rec = self.migrate_one(vm, from, to)?;
        self.records.push(rec);
        Ok(())
    }

    fn transfer(&mut self, vm: &VmId) -> Option<control::state::Transfer> {
        let last = self.records.last().filter(|r| &r.vm == vm)?;
        Some(transfer(&last.report))
    }
}

/// What a migration carried, for the state database's journal.
pub fn transfer(r: &v2m::MigrationReport) -> control::state::Transfer {
    control::state::Transfer {
        storage: r.storage.as_str().to_string(),
        disk_bytes: r.disk_bytes,
        memory_bytes: r.transferred_bytes,
        total_ms: r.total_time_ms,
        downtime_ms: r.downtime_ms,
    }
}

/// Finds a VM by asking every node's hypervisor, not this process's memory: a restarted
/// controller has no handles, but the VMs kept running.
pub struct RunDirLocator {
    nodes: Vec<(NodeName, QemuPlugin)>,
}

impl RunDirLocator {
    pub fn new(nodes: impl IntoIterator<Item = (NodeName, QemuConfig)>) -> Self {
        Self {
            nodes: nodes
                .into_iter()
                .map(|(n, c)| (n, QemuPlugin::new(c)))
                .collect(),
        }
    }
}

impl VmLocator for RunDirLocator {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, LocateError> {
        let name = vm_name(vm)?;
        let mut found = Vec::new();
        for (node, plugin) in &self.nodes {
            // attach() never owns the process: dropping the handle leaves the VM alone.
            let Ok(mut h) = plugin.attach(&name) else {
                continue;
            };
            match h.status() {
                Ok(s) if matches!(s.state, VmState::Running | VmState::Paused) => {
                    found.push(node.clone())
                }
                _ => {}
            }
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => Err(FleetError::Ambiguous {
                vm: vm.to_string(),
                nodes: found.iter().map(|n| n.to_string()).collect(),
            }
            .into()),
        }
    }
}

impl VmLocator for QemuFleet {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, LocateError> {
        let Some(p) = self.vms.get_mut(vm) else {
            return Ok(None);
        };
        match p.vm.vm_mut().status() {
            Ok(s) if matches!(s.state, VmState::Running | VmState::Paused) => {
                Ok(Some(p.node.clone()))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(FleetError::V2m {
                vm: vm.to_string(),
                node: p.node.to_string(),
                source: Box::new(e),
            }
            .into()),
        }
    }
}

/// The guest view for the sampler: each VM's guest agent, through its link.
impl monitor::GuestSource for QemuFleet {
    fn guest_proc(
        &mut self,
        vm: &VmId,
    ) -> Result<Option<monitor::GuestProc>, monitor::MonitorError> {
        let Some(link) = self.link(vm) else {
            return Ok(None);
        };
        let (meminfo, stat) =
            link.sample(Duration::from_secs(10))
                .map_err(|e| monitor::MonitorError::Guest {
                    vm: vm.to_string(),
                    reason: e.to_string(),
                })?;
        Ok(Some(monitor::GuestProc { meminfo, stat }))
    }
}
