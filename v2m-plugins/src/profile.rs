//! The VM profile: what one VM gets, derived by the launcher from the job's allocation, its
//! effective environment and the site policy. Plugins only translate it; they never invent
//! resources. Serialises to YAML and JSON (`vse vm explain` shows both the profile and the exact
//! hypervisor command line/config it becomes).

use crate::error::{Result, V2mError};
use crate::names::{CpuSet, Hostname, MacAddr, VmName};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: VmName,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Host CPUs the vCPU threads are pinned to (vCPU i → cpuset[i mod n]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpuset: Option<CpuSet>,
    /// Host NUMA node the guest memory is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    pub image: ImageRef,
    /// Disks in guest order (vda, vdb, …). The first is usually the per-VM overlay of the image.
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub console: Console,
}

/// The image side, kept small so it fits both the test fixture and `vse build`'s manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    pub kernel: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// The shared master root disk; VMs use per-VM overlays of it (see [`crate::overlay`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_disk: Option<PathBuf>,
    #[serde(default)]
    pub cmdline: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub path: PathBuf,
    pub format: DiskFormat,
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// No NIC at all.
    #[default]
    None,
    /// User-mode networking (slirp), for hosts without a bridge.
    User,
    /// A tap on an existing host bridge (`bridge` names it).
    Bridge,
    /// Frames as UDP datagrams between `local` (this VM's endpoint) and `remote` (a job's
    /// switch): a private L2 segment across hosts with no tap, bridge or privilege.
    Udp,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub mode: NetMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// Guest address and prefix length from the policy's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_len: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Hostname>,
    /// Mode udp: the VM's own UDP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<std::net::SocketAddr>,
    /// Mode udp: where its frames go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Console {
    /// Where the serial console is written; default: `console.log` in the VM's run directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
}

impl Profile {
    /// A minimal profile: direct kernel boot, no disk, no network.
    pub fn new(name: VmName, vcpus: u32, memory_mib: u64, image: ImageRef) -> Self {
        Profile {
            name,
            vcpus,
            memory_mib,
            cpuset: None,
            numa_node: None,
            image,
            disks: Vec::new(),
            network: Network::default(),
            console: Console::default(),
        }
    }

    /// Checks what a plugin cannot check by itself; file existence is checked when defining.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, message: String, hint: &str| V2mError::InvalidProfile {
            origin: String::new(),
            field: field.into(),
            message,
            hint: hint.into(),
        };
        if self.vcpus == 0 || self.vcpus > 255 {
            return Err(bad(
                "vcpus",
                format!("{} is out of range", self.vcpus),
                "use 1..=255",
            ));
        }
        if self.memory_mib < 32 {
            return Err(bad(
                "memory_mib",
                format!("{} MiB is too small", self.memory_mib),
                "use at least 32",
            ));
        }
        if !self.image.kernel.is_absolute() {
            return Err(bad(
                "image.kernel",
                format!("{} is not absolute", self.image.kernel.display()),
                "use an absolute path",
            ));
        }
        if self.image.cmdline.contains('\n') {
            return Err(bad(
                "image.cmdline",
                "contains a newline".into(),
                "use one line",
            ));
        }
        for (i, d) in self.disks.iter().enumerate() {
            if !d.path.is_absolute() {
                return Err(bad(
                    &format!("disks[{i}].path"),
                    format!("{} is not absolute", d.path.display()),
                    "use an absolute path",
                ));
            }
            if d.path.to_string_lossy().contains(',') {
                return Err(bad(
                    &format!("disks[{i}].path"),
                    "contains ','".into(),
                    "QEMU option syntax cannot carry ',' safely: rename the file",
                ));
            }
        }
        match (self.network.mode, &self.network.bridge) {
            (NetMode::Bridge, None) => {
                return Err(bad(
                    "network.bridge",
                    "mode bridge needs a bridge name".into(),
                    "set network.bridge, or use mode: user where no bridge exists",
                ));
            }
            (NetMode::Bridge, Some(b))
                if b.is_empty()
                    || b.len() > 15
                    || !b
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
            {
                return Err(bad(
                    "network.bridge",
                    format!("{b:?} is not a valid interface name"),
                    "1-15 of letters, digits, '-', '_'",
                ));
            }
            (NetMode::None | NetMode::User | NetMode::Udp, Some(_)) => {
                return Err(bad(
                    "network.bridge",
                    "only meaningful with mode: bridge".into(),
                    "remove it or set mode: bridge",
                ));
            }
            _ => {}
        }
        match (self.network.mode, self.network.local, self.network.remote) {
            (NetMode::Udp, Some(l), Some(r)) if l.port() == 0 || r.port() == 0 => {
                return Err(bad(
                    "network.local",
                    "udp endpoints need explicit ports".into(),
                    "give local and remote as ADDRESS:PORT with a port other than 0",
                ));
            }
            (NetMode::Udp, Some(_), Some(_)) => {}
            (NetMode::Udp, _, _) => {
                return Err(bad(
                    "network.local",
                    "mode udp needs local and remote endpoints".into(),
                    "set network.local and network.remote (ADDRESS:PORT)",
                ));
            }
            (_, None, None) => {}
            _ => {
                return Err(bad(
                    "network.local",
                    "local/remote are only meaningful with mode: udp".into(),
                    "remove them or set mode: udp",
                ));
            }
        }
        if self.network.ip.is_some() != self.network.prefix_len.is_some() {
            return Err(bad(
                "network.ip",
                "ip and prefix_len go together".into(),
                "set both or neither",
            ));
        }
        if let Some(p) = self.network.prefix_len
            && p > 32
        {
            return Err(bad("network.prefix_len", format!("{p} > 32"), "use 0..=32"));
        }
        Ok(())
    }

    /// The kernel command line with the network identity appended in the kernel's `ip=` syntax
    /// (`ip=<client>::<gw>:<netmask>:<hostname>::off`), so the guest configures itself.
    pub fn full_cmdline(&self) -> String {
        let mut c = self.image.cmdline.trim().to_owned();
        let n = &self.network;
        if let (Some(ip), Some(p)) = (n.ip, n.prefix_len) {
            let mask = if p == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(p))
            };
            let gw = n.gateway.map(|g| g.to_string()).unwrap_or_default();
            let host = n.hostname.as_ref().map(|h| h.as_str()).unwrap_or("");
            c.push_str(&format!(
                " ip={ip}::{gw}:{}:{host}::off",
                Ipv4Addr::from(mask)
            ));
        } else if let Some(h) = &n.hostname {
            c.push_str(&format!(" hostname={h}"));
        }
        c.trim().to_owned()
    }

    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self)
            .unwrap_or_else(|e| format!("# cannot serialise profile: {e}\n"))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Parses YAML (JSON is YAML too); errors carry `origin:line:column`.
    pub fn from_yaml(text: &str, origin: &Path) -> Result<Profile> {
        let p: Profile = serde_saphyr::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" in {}:{}:{}", origin.display(), l.line(), l.column()))
                .unwrap_or_else(|| format!(" in {}", origin.display()));
            V2mError::InvalidProfile {
                origin: at,
                field: "profile".into(),
                message: e.to_string().lines().next().unwrap_or("").to_owned(),
                hint: "see `vse vm explain --example` for a complete profile".into(),
            }
        })?;
        p.validate().map_err(|e| match e {
            V2mError::InvalidProfile {
                field,
                message,
                hint,
                ..
            } => V2mError::InvalidProfile {
                origin: format!(" in {}", origin.display()),
                field,
                message,
                hint,
            },
            other => other,
        })?;
        Ok(p)
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let text =
            std::fs::read_to_string(path).map_err(|e| V2mError::io("reading profile", path, e))?;
        Profile::from_yaml(&text, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        let mut p = Profile::new(
            "job7-0".parse().unwrap(),
            2,
            256,
            ImageRef {
                kernel: "/img/vmlinuz".into(),
                initrd: Some("/img/initrd".into()),
                root_disk: None,
                cmdline: "console=ttyS0".into(),
            },
        );
        p.cpuset = Some("0-1".parse().unwrap());
        p.numa_node = Some(0);
        p.network = Network {
            mode: NetMode::User,
            bridge: None,
            mac: Some("52:54:00:00:00:07".parse().unwrap()),
            ip: Some("10.0.0.7".parse().unwrap()),
            prefix_len: Some(24),
            gateway: Some("10.0.0.1".parse().unwrap()),
            hostname: Some("node-7".parse().unwrap()),
            ..Network::default()
        };
        p
    }

    #[test]
    fn yaml_and_json_round_trip() {
        let p = sample();
        let y = p.to_yaml();
        assert_eq!(
            Profile::from_yaml(&y, Path::new("p.yaml")).unwrap(),
            p,
            "{y}"
        );
        let j = p.to_json();
        assert_eq!(
            Profile::from_yaml(&j, Path::new("p.json")).unwrap(),
            p,
            "{j}"
        );
    }

    #[test]
    fn cmdline_carries_network_identity() {
        assert_eq!(
            sample().full_cmdline(),
            "console=ttyS0 ip=10.0.0.7::10.0.0.1:255.255.255.0:node-7::off"
        );
    }

    #[test]
    fn bad_input_is_located() {
        let y = "name: a\nvcpus: 1\nmemory_mib: 64\nimage:\n  kernel: /k\n  colour: red\n";
        let e = Profile::from_yaml(y, Path::new("vm.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("vm.yaml:"), "{e}");
        assert!(e.contains("colour"), "{e}");
        let y = "name: a\nvcpus: 0\nmemory_mib: 64\nimage:\n  kernel: /k\n";
        let e = Profile::from_yaml(y, Path::new("vm.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("vcpus") && e.contains("1..=255"), "{e}");
        let y = "name: 'a b'\nvcpus: 1\nmemory_mib: 64\nimage:\n  kernel: /k\n";
        let e = Profile::from_yaml(y, Path::new("vm.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("may only contain"), "{e}");
    }
}
