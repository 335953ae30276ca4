//! The migration daemon's hands on real VMs: [`LiveMigrator`] and [`VmLocator`] over the V2M
//! QEMU plugin. A "node" is one QEMU plugin instance with its own run root: on a cluster the
//! node's agent holds it; on one machine (tests, `vse bench migrate`) several run roots stand
//! for several nodes. A migration prepares the destination with `-incoming` on the target node,
//! sends the state with explicit bandwidth/downtime limits, and only then swaps the handle, so
//! on any failure the source keeps running and the half-made destination is killed on drop.

use crate::guest_link::{GuestLink, LinkError};
use control::migrate::{LiveMigrator, MigrateError};
use control::state::{LocateError, VmLocator};
use monitor::{NodeName, VmId};
use std::collections::HashMap;
use std::time::Duration;
use v2m::qemu::{QemuConfig, QemuPlugin};
use v2m::{
    MigrationParams, MigrationReport, MigrationTarget, Plugin, Profile, Vm, VmName, VmState,
};

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
    #[error("node {node}: {source}")]
    Cgroup { node: String, source: CgroupError },
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
    #[error("preparing the destination on {node}: {source}")]
    Prepare {
        node: String,
        source: Box<v2m::V2mError>,
    },
    #[error("the destination on {node} did not report its listening address")]
    NoListenAddress { node: String },
    #[error("sending the state from {node}: {source}")]
    Send {
        node: String,
        source: Box<v2m::V2mError>,
    },
    #[error("the destination on {node} did not take over: {source}")]
    Takeover {
        node: String,
        source: Box<v2m::V2mError>,
    },
    #[error("reconnecting the guest agent on {node}: {source}")]
    Reattach { node: String, source: LinkError },
    #[error("VM {vm} runs on several nodes at once ({}); refusing to guess", nodes.join(", "))]
    Ambiguous { vm: String, nodes: Vec<String> },
}

/// Why a hypervisor process could not be put into its node's cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{0}")]
    Status(#[source] Box<v2m::V2mError>),
    #[error("the hypervisor process has no pid")]
    NoPid,
    #[error("moving pid {pid} into {}: {source}", dir.display())]
    Move {
        pid: u32,
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
}

struct Placed {
    node: NodeName,
    profile: Profile,
    vm: Box<dyn Vm>,
    link: Option<GuestLink>,
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
    cgroups: HashMap<NodeName, std::path::PathBuf>,
    vms: HashMap<VmId, Placed>,
    params: MigrationParams,
    listen_host: String,
    finish_timeout: Duration,
    records: Vec<MigrationRecord>,
}

/// The hypervisor name of a VM: the VmId, which must also satisfy V2M's stricter alphabet.
pub fn vm_name(vm: &VmId) -> Result<VmName, FleetError> {
    vm.as_str().parse().map_err(|source| FleetError::BadName {
        vm: vm.to_string(),
        source,
    })
}

impl QemuFleet {
    /// `listen_host` is the address destinations listen on (`127.0.0.1` on one machine).
    pub fn new(params: MigrationParams, listen_host: &str) -> Self {
        Self {
            nodes: HashMap::new(),
            cgroups: HashMap::new(),
            vms: HashMap::new(),
            params,
            listen_host: listen_host.to_string(),
            finish_timeout: Duration::from_secs(120),
            records: Vec::new(),
        }
    }

    pub fn add_node(&mut self, node: NodeName, cfg: QemuConfig) {
        self.nodes.insert(node, QemuPlugin::new(cfg));
    }

    /// A node whose VMs run inside the cgroup directory `cgroup` (v1 or v2): its memory view
    /// then includes exactly its own VMs and whatever else runs there.
    pub fn add_node_in_cgroup(
        &mut self,
        node: NodeName,
        cfg: QemuConfig,
        cgroup: std::path::PathBuf,
    ) {
        self.cgroups.insert(node.clone(), cgroup);
        self.add_node(node, cfg);
    }

    fn enter_cgroup(&self, node: &NodeName, vm: &mut dyn Vm) -> Result<(), FleetError> {
        let Some(dir) = self.cgroups.get(node) else {
            return Ok(());
        };
        let err = |source| FleetError::Cgroup {
            node: node.to_string(),
            source,
        };
        let pid = vm
            .status()
            .map_err(|e| err(CgroupError::Status(Box::new(e))))?
            .pid
            .ok_or(err(CgroupError::NoPid))?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|source| {
            err(CgroupError::Move {
                pid,
                dir: dir.clone(),
                source,
            })
        })
    }

    fn plugin(&self, node: &NodeName) -> Result<&QemuPlugin, FleetError> {
        self.nodes
            .get(node)
            .ok_or_else(|| FleetError::UnknownNode(node.to_string()))
    }

    /// Defines and boots `profile` on `node`; the fleet owns it (killed on drop).
    pub fn start(&mut self, id: VmId, node: &NodeName, profile: Profile) -> Result<(), FleetError> {
        if self.vms.contains_key(&id) {
            return Err(FleetError::Duplicate(id.to_string()));
        }
        let v2m_err = |source| FleetError::V2m {
            vm: id.to_string(),
            node: node.to_string(),
            source: Box::new(source),
        };
        let mut vm = self.plugin(node)?.define(&profile).map_err(v2m_err)?;
        vm.start().map_err(v2m_err)?;
        self.enter_cgroup(node, &mut *vm)?;
        self.vms.insert(
            id,
            Placed {
                node: node.clone(),
                profile,
                vm,
                link: None,
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
        Ok(&*self.placed(id)?.vm)
    }

    pub fn vm_mut(&mut self, id: &VmId) -> Result<&mut dyn Vm, FleetError> {
        Ok(&mut *self
            .vms
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))?
            .vm)
    }

    pub fn node_of(&self, id: &VmId) -> Result<&NodeName, FleetError> {
        Ok(&self.placed(id)?.node)
    }

    /// The hypervisor process (host view of the VM: RSS and CPU time come from it).
    pub fn pid(&mut self, id: &VmId) -> Option<u32> {
        self.vms.get_mut(id)?.vm.status().ok()?.pid
    }

    /// Attaches the guest agent link that follows the VM through its migrations.
    pub fn set_link(&mut self, id: &VmId, link: GuestLink) -> Result<(), FleetError> {
        self.vms
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))?
            .link = Some(link);
        Ok(())
    }

    pub fn link(&self, id: &VmId) -> Option<&GuestLink> {
        self.vms.get(id)?.link.as_ref()
    }

    /// Every migration done through this fleet, oldest first.
    pub fn records(&self) -> &[MigrationRecord] {
        &self.records
    }

    /// Stops every VM (gracefully, then by force) and returns how many were stopped.
    pub fn shutdown(&mut self, grace: Duration) -> usize {
        let mut n = 0;
        for (_, mut p) in self.vms.drain() {
            drop(p.link.take());
            if p.vm.stop(grace).is_ok() {
                n += 1;
            }
        }
        n
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
        let dest = self.plugin(to)?;
        let listen = MigrationTarget {
            host: self.listen_host.clone(),
            port: 0,
        };
        // Dropped (and killed) on any early return below: no half-made VM survives a failure.
        let at = |node: &NodeName| node.to_string();
        let mut incoming = dest
            .prepare_incoming(&placed.profile, &listen)
            .map_err(|e| FleetError::Prepare {
                node: at(to),
                source: Box::new(e),
            })?;
        self.enter_cgroup(to, &mut *incoming)?;
        let target = incoming
            .incoming()
            .cloned()
            .ok_or_else(|| FleetError::NoListenAddress { node: at(to) })?;
        let placed = self
            .vms
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownVm(id.to_string()))?;
        let report = placed
            .vm
            .migrate(&target, &self.params)
            .map_err(|e| FleetError::Send {
                node: at(from),
                source: Box::new(e),
            })?;
        incoming
            .finish_incoming(self.finish_timeout)
            .map_err(|e| FleetError::Takeover {
                node: at(to),
                source: Box::new(e),
            })?;
        let old = std::mem::replace(&mut placed.vm, incoming);
        placed.node = to.clone();
        // The source QEMU stopped itself after the handover; this reaps it.
        drop(old);
        if let (Some(link), Some(sock)) = (&placed.link, placed.vm.agent_socket()) {
            link.reattach(sock).map_err(|source| FleetError::Reattach {
                node: at(to),
                source,
            })?;
        }
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
        match p.vm.status() {
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
