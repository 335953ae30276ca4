//! Profile → libvirt domain XML (direct kernel boot, pinning in `<cputune>`, memory binding in
//! `<numatune>`, per-VM overlay disks, the agent channel). Pure, so `explain` shows exactly what
//! `define` sends and the translation is golden-file tested.

use crate::plugin::AGENT_PORT_NAME;
use crate::profile::{NetMode, Profile};
use crate::qemu::Accel;
use std::fmt::Write;
use std::path::Path;

fn x(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

pub fn domain_xml(profile: &Profile, emulator: &Path, console: &Path, accel: Accel) -> String {
    let mut c = String::new();
    let dtype = match accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "qemu",
    };
    let _ = writeln!(c, "<domain type='{dtype}'>");
    let _ = writeln!(c, "  <name>{}</name>", x(profile.name.as_str()));
    // libvirt generates the VM generation id (vmgenid) and a new one whenever the domain is
    // restored from a saved state: see the QEMU argv's `vmgenid` device.
    let _ = writeln!(c, "  <genid/>");
    let _ = writeln!(c, "  <memory unit='MiB'>{}</memory>", profile.memory_mib);
    let _ = writeln!(c, "  <vcpu placement='static'>{}</vcpu>", profile.vcpus);
    if let Some(set) = &profile.cpuset {
        let cpus = set.cpus();
        let _ = writeln!(c, "  <cputune>");
        for i in 0..profile.vcpus as usize {
            let _ = writeln!(
                c,
                "    <vcpupin vcpu='{i}' cpuset='{}'/>",
                cpus[i % cpus.len()]
            );
        }
        let _ = writeln!(c, "    <emulatorpin cpuset='{set}'/>");
        let _ = writeln!(c, "  </cputune>");
    }
    if let Some(node) = profile.numa_node {
        let _ = writeln!(
            c,
            "  <numatune>\n    <memory mode='strict' nodeset='{node}'/>\n  </numatune>"
        );
    }
    let _ = writeln!(c, "  <os>\n    <type arch='x86_64' machine='pc'>hvm</type>");
    let _ = writeln!(
        c,
        "    <kernel>{}</kernel>",
        x(&profile.image.kernel.to_string_lossy())
    );
    if let Some(i) = &profile.image.initrd {
        let _ = writeln!(c, "    <initrd>{}</initrd>", x(&i.to_string_lossy()));
    }
    let _ = writeln!(
        c,
        "    <cmdline>{}</cmdline>\n  </os>",
        x(&profile.full_cmdline())
    );
    let _ = writeln!(
        c,
        "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n  <on_crash>destroy</on_crash>"
    );
    let _ = writeln!(c, "  <devices>");
    let _ = writeln!(
        c,
        "    <emulator>{}</emulator>",
        x(&emulator.to_string_lossy())
    );
    for (i, d) in profile.disks.iter().enumerate() {
        let dev = format!("vd{}", (b'a' + i as u8) as char);
        let ro = if d.readonly {
            "\n      <readonly/>"
        } else {
            ""
        };
        let _ = writeln!(
            c,
            "    <disk type='file' device='disk'>\n      <driver name='qemu' type='{}'/>\n      <source file='{}'/>\n      <target dev='{dev}' bus='virtio'/>{ro}\n    </disk>",
            d.format.as_str(),
            x(&d.path.to_string_lossy())
        );
    }
    let mac = profile
        .network
        .mac
        .map(|m| format!("\n      <mac address='{m}'/>"))
        .unwrap_or_default();
    match profile.network.mode {
        NetMode::None => {}
        NetMode::User => {
            let _ = writeln!(
                c,
                "    <interface type='user'>{mac}\n      <model type='virtio'/>\n    </interface>"
            );
        }
        NetMode::Udp => {
            if let (Some(l), Some(r)) = (profile.network.local, profile.network.remote) {
                let _ = writeln!(
                    c,
                    "    <interface type='udp'>{mac}\n      <source address='{}' port='{}'>\n        <local address='{}' port='{}'/>\n      </source>\n      <model type='virtio'/>\n    </interface>",
                    r.ip(),
                    r.port(),
                    l.ip(),
                    l.port()
                );
            }
        }
        NetMode::Bridge => {
            let br = x(profile.network.bridge.as_deref().unwrap_or(""));
            let _ = writeln!(
                c,
                "    <interface type='bridge'>\n      <source bridge='{br}'/>{mac}\n      <model type='virtio'/>\n    </interface>"
            );
        }
    }
    let _ = writeln!(
        c,
        "    <serial type='file'>\n      <source path='{}' append='on'/>\n      <target port='0'/>\n    </serial>",
        x(&console.to_string_lossy())
    );
    let _ = writeln!(c, "    <controller type='virtio-serial' index='0'/>");
    // No source path: libvirt creates the socket in its own channel directory, which the
    // unprivileged QEMU user can write; the live XML tells us where (see `agent_socket`).
    let _ = writeln!(
        c,
        "    <channel type='unix'>\n      <target type='virtio' name='{AGENT_PORT_NAME}'/>\n    </channel>"
    );
    let _ = writeln!(c, "    <memballoon model='none'/>");
    let _ = writeln!(c, "  </devices>\n</domain>");
    c
}

/// The agent socket path libvirt chose, from a live domain XML.
pub fn agent_socket_from_live_xml(xml: &str) -> Option<String> {
    let chan = xml
        .split("<channel type='unix'>")
        .skip(1)
        .find(|c| c.contains(AGENT_PORT_NAME))?;
    let src = chan.split("<source ").nth(1)?;
    let path = src.split("path='").nth(1)?;
    Some(
        path.split('\'')
            .next()?
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ImageRef, Network};

    #[test]
    fn udp_nic_has_both_endpoints() {
        let mut p = Profile::new(
            "j1-r0".parse().unwrap(),
            1,
            256,
            ImageRef {
                kernel: "/img/vmlinuz".into(),
                initrd: None,
                root_disk: None,
                cmdline: String::new(),
            },
        );
        p.network = Network {
            mode: NetMode::Udp,
            mac: Some("02:fb:00:00:00:00".parse().unwrap()),
            local: Some("10.0.0.5:40001".parse().unwrap()),
            remote: Some("10.0.0.1:40000".parse().unwrap()),
            ..Network::default()
        };
        let xml = domain_xml(&p, Path::new("/q"), Path::new("/c.log"), Accel::Tcg);
        assert!(
            xml.contains(
                "<interface type='udp'>\n      <mac address='02:fb:00:00:00:00'/>\n      \
                 <source address='10.0.0.1' port='40000'>\n        \
                 <local address='10.0.0.5' port='40001'/>\n      </source>"
            ),
            "{xml}"
        );
    }
}
