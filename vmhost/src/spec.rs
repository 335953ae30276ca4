//! What one VM of an image gets: name, vCPUs, memory, the host cores it is pinned to and its
//! NIC on a job network. Pure: turning a spec into a V2M [`Profile`] touches nothing, so the
//! derivation is tested without a hypervisor.

use std::net::SocketAddr;
use std::path::Path;
use v2m::{CpuSet, Disk, DiskFormat, ImageRef, MacAddr, NetMode, Network, Profile, VmName};
use vse_image::ImageDir;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("VM {vm}: host CPUs {cpus:?}: {reason}")]
    CpuSet {
        vm: String,
        cpus: Vec<usize>,
        reason: String,
    },
}

/// A NIC on a job's private network: frames travel as UDP datagrams between the VM's own
/// endpoint and the job's switch (no tap, bridge or privilege needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub mac: MacAddr,
    /// The VM's endpoint on this host (the switch admits it before the VM starts).
    pub local: SocketAddr,
    /// The job's switch.
    pub remote: SocketAddr,
}

/// One VM of an image. The disk is not part of the spec: every boot gets its own
/// copy-on-write overlay of the image's root disk (see [`crate::boot`]).
#[derive(Debug, Clone, PartialEq)]
pub struct VmSpec {
    pub name: VmName,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Host CPUs the vCPU threads are pinned to (vCPU i → cpuset[i mod n]).
    pub cpuset: Option<CpuSet>,
    /// The host NUMA node the guest's memory is bound to: that of the pinned cores.
    pub numa_node: Option<u32>,
    pub nic: Option<Nic>,
    image: ImageRef,
    identity: ImageIdentity,
}

/// What an image's content is, for keys that must change with it (boot templates): the
/// manifest's SHA-256 (it lists every part's digest), and the parts it gives no digest for
/// (hand-assembled test images), which are then known by file identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageIdentity {
    pub manifest_sha256: String,
    pub undigested: Vec<std::path::PathBuf>,
}

impl ImageIdentity {
    pub fn of(image: &ImageDir) -> Self {
        use sha2::Digest;
        let m = image.manifest();
        let json = serde_json::to_vec(m).unwrap_or_default();
        ImageIdentity {
            manifest_sha256: hex(&sha2::Sha256::digest(&json)),
            undigested: (m.parts.iter())
                .filter(|(_, p)| p.sha256.is_empty())
                .filter_map(|(name, _)| image.part(name))
                .collect(),
        }
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Cores of this host (at least 1).
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A plan's CPU numbers on a host with `host` cores: a test cluster may declare more CPUs than
/// the machine has (Slurm's config_overrides), so the plan is folded onto the cores that exist
/// rather than fail to pin.
pub fn fold_cpus(planned: &[usize], host: usize) -> Vec<usize> {
    planned.iter().map(|c| c % host.max(1)).collect()
}

impl VmSpec {
    /// Direct kernel boot of `image` (its kernel, initramfs and command line), no pinning,
    /// no NIC.
    pub fn new(image: &ImageDir, name: VmName, vcpus: u32, memory_mib: u64) -> Self {
        VmSpec {
            name,
            vcpus,
            memory_mib,
            cpuset: None,
            numa_node: None,
            nic: None,
            image: ImageRef {
                kernel: image.kernel().to_path_buf(),
                initrd: Some(image.initrd().to_path_buf()),
                root_disk: Some(image.root().to_path_buf()),
                cmdline: image.cmdline().to_string(),
            },
            identity: ImageIdentity::of(image),
        }
    }

    /// Pins the vCPUs to the planned host CPUs, folded onto this host's cores.
    pub fn pin(&mut self, planned: &[usize]) -> Result<(), SpecError> {
        self.pin_on(planned, host_cores())
    }

    /// [`VmSpec::pin`] for a host with `host` cores. The memory is bound to the cores' node.
    pub fn pin_on(&mut self, planned: &[usize], host: usize) -> Result<(), SpecError> {
        let cpus = fold_cpus(planned, host);
        let set = CpuSet::new(cpus.clone()).map_err(|e| SpecError::CpuSet {
            vm: self.name.to_string(),
            cpus,
            reason: e.0,
        })?;
        self.numa_node = crate::numa::node_of(set.cpus(), &crate::numa::host_nodes());
        self.cpuset = Some(set);
        Ok(())
    }

    /// The image side of the VM (kernel, initramfs, master root disk, command line).
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    /// What the image's content is (see [`ImageIdentity`]).
    pub fn image_identity(&self) -> &ImageIdentity {
        &self.identity
    }

    /// The V2M profile of this VM booting on the copy-on-write overlay `overlay` (qcow2 over
    /// the image's root disk), which becomes its first disk.
    pub fn profile(&self, overlay: &Path) -> Profile {
        let mut p = Profile::new(
            self.name.clone(),
            self.vcpus,
            self.memory_mib,
            self.image.clone(),
        );
        p.cpuset = self.cpuset.clone();
        p.numa_node = self.numa_node;
        p.disks.push(Disk {
            path: overlay.to_path_buf(),
            format: DiskFormat::Qcow2,
            readonly: false,
        });
        if let Some(nic) = &self.nic {
            p.network = Network {
                mode: NetMode::Udp,
                mac: Some(nic.mac),
                local: Some(nic.local),
                remote: Some(nic.remote),
                ..Network::default()
            };
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use vse_image::{MANIFEST, Manifest, Part};

    fn image(dir: &Path) -> ImageDir {
        let mut parts = std::collections::BTreeMap::new();
        for (name, file) in [
            ("kernel", "vmlinuz"),
            ("initrd", "initrd.img"),
            ("root", "root.raw"),
        ] {
            std::fs::write(dir.join(file), b"x").unwrap();
            parts.insert(
                name.to_string(),
                Part {
                    file: file.into(),
                    size: 1,
                    sha256: String::new(),
                },
            );
        }
        let m = Manifest::assembled("test", "console=ttyS0 quiet", parts);
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        ImageDir::open(dir).unwrap()
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "vmhost-spec-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_spec_becomes_a_profile_on_its_overlay() {
        let d = tmp();
        let img = image(&d);
        let mut spec = VmSpec::new(&img, "vm-3".parse().unwrap(), 2, 384);
        spec.nic = Some(Nic {
            mac: "52:54:00:00:00:03".parse().unwrap(),
            local: "127.0.0.1:4000".parse().unwrap(),
            remote: "127.0.0.1:5000".parse().unwrap(),
        });
        let p = spec.profile(Path::new("/scratch/root.qcow2"));
        assert_eq!(p.name.as_str(), "vm-3");
        assert_eq!((p.vcpus, p.memory_mib), (2, 384));
        assert_eq!(p.image.kernel, d.join("vmlinuz"));
        assert_eq!(p.image.initrd, Some(d.join("initrd.img")));
        assert_eq!(p.image.root_disk, Some(d.join("root.raw")));
        assert_eq!(p.image.cmdline, "console=ttyS0 quiet");
        assert_eq!(p.disks.len(), 1);
        assert_eq!(p.disks[0].path, Path::new("/scratch/root.qcow2"));
        assert_eq!(p.disks[0].format, DiskFormat::Qcow2);
        assert!(!p.disks[0].readonly);
        assert_eq!(p.network.mode, NetMode::Udp);
        assert_eq!(p.network.local, Some("127.0.0.1:4000".parse().unwrap()));
        assert_eq!(p.network.remote, Some("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(p.cpuset, None);
        p.validate().unwrap();

        let plain = VmSpec::new(&img, "vm-4".parse().unwrap(), 1, 256);
        assert_eq!(plain.profile(Path::new("/o")).network, Network::default());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn planned_cpus_fold_onto_the_cores_that_exist() {
        assert_eq!(fold_cpus(&[0, 1, 2, 3], 2), [0, 1, 0, 1]);
        assert_eq!(fold_cpus(&[5, 9], 4), [1, 1]);
        assert_eq!(fold_cpus(&[7], 0), [0]);
        let d = tmp();
        let img = image(&d);
        let mut spec = VmSpec::new(&img, "vm-0".parse().unwrap(), 4, 256);
        spec.pin_on(&[2, 3, 4, 5], 4).unwrap();
        // Sorted and deduplicated: vCPU i runs on cpuset[i mod n].
        assert_eq!(spec.cpuset.as_ref().unwrap().cpus(), [0, 1, 2, 3]);
        spec.pin_on(&[6, 7], 2).unwrap();
        assert_eq!(spec.cpuset.as_ref().unwrap().cpus(), [0, 1]);
        let p = spec.profile(Path::new("/o"));
        assert_eq!(p.cpuset.unwrap().cpus(), [0, 1]);
        let e = spec.pin_on(&[], 2).unwrap_err();
        assert!(e.to_string().contains("vm-0"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
