//! Profile → exact `qemu-system-x86_64` argv. Pure (no I/O) so `explain` shows precisely what
//! `start` runs, and so the translation is unit-tested without QEMU.

use super::accel::Accel;
use super::netfd::NET_FD;
use super::sandbox::SANDBOX;
use crate::plugin::AGENT_PORT_NAME;
use crate::profile::{NetMode, Profile};
use std::path::{Path, PathBuf};

/// The per-VM files QEMU is pointed at (all inside the VM's run directory, except the console
/// log when the profile names one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    pub dir: PathBuf,
    pub qmp: PathBuf,
    pub agent: PathBuf,
    pub console: PathBuf,
    pub stderr: PathBuf,
    pub meta: PathBuf,
    pub profile: PathBuf,
}

impl RunPaths {
    pub fn new(run_root: &Path, profile: &Profile) -> RunPaths {
        let dir = run_root.join(profile.name.as_str());
        RunPaths {
            qmp: dir.join("qmp.sock"),
            agent: dir.join("agent.sock"),
            console: profile
                .console
                .log
                .clone()
                .unwrap_or_else(|| dir.join("console.log")),
            stderr: dir.join("qemu.stderr"),
            meta: dir.join("vm.json"),
            profile: dir.join("profile.json"),
            dir,
        }
    }
}

/// How the process starts: a fresh boot (held with `-S` until vCPUs are pinned) or waiting
/// for incoming state (live migration destination, or restore from a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Fresh,
    Incoming,
}

/// QEMU option values are comma-separated lists; a literal comma is written twice.
fn opt(v: &Path) -> String {
    v.to_string_lossy().replace(',', ",,")
}

pub fn argv(
    binary: &Path,
    profile: &Profile,
    paths: &RunPaths,
    accel: Accel,
    launch: Launch,
) -> Vec<String> {
    let mut a: Vec<String> = vec![binary.to_string_lossy().into_owned()];
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    let mem = profile.memory_mib;
    let machine = if profile.numa_node.is_some() {
        "pc,memory-backend=pc.ram".to_string()
    } else {
        "pc".to_string()
    };
    push(&["-name", &format!("guest={},debug-threads=on", profile.name)]);
    push(&["-machine", &machine]);
    push(&["-accel", accel.qemu_arg(profile.vcpus)]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    push(&["-sandbox", SANDBOX]);
    push(&["-m", &format!("{mem}M"), "-smp", &profile.vcpus.to_string()]);
    // A new generation id on every QEMU start, restores included: the guest kernel's vmgenid
    // driver reseeds its RNG when it changes, so VMs restored from one saved state never share
    // random bytes.
    push(&["-device", "vmgenid,guid=auto"]);
    if let Some(node) = profile.numa_node {
        // Guest RAM comes from a backend bound to the host node, so the kernel never places it
        // elsewhere (the in-QEMU equivalent of `numactl --membind`). Named as the machine names
        // its own RAM: the migration stream names RAM blocks, so a bound VM can move to or
        // from an unbound one.
        push(&[
            "-object",
            &format!("memory-backend-ram,id=pc.ram,size={mem}M,host-nodes={node},policy=bind"),
        ]);
    }
    push(&["-kernel", &profile.image.kernel.to_string_lossy()]);
    if let Some(initrd) = &profile.image.initrd {
        push(&["-initrd", &initrd.to_string_lossy()]);
    }
    let cmdline = profile.full_cmdline();
    if !cmdline.is_empty() {
        push(&["-append", &cmdline]);
    }
    // Appending keeps one console log across restore and re-start of the same VM.
    push(&[
        "-chardev",
        &format!("file,id=serial0,path={},append=on", opt(&paths.console)),
    ]);
    push(&["-serial", "chardev:serial0"]);
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", opt(&paths.qmp)),
    ]);
    push(&["-device", "virtio-serial-pci,id=vser0"]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=vseagent,path={},server=on,wait=off",
            opt(&paths.agent)
        ),
    ]);
    push(&[
        "-device",
        &format!("virtserialport,bus=vser0.0,chardev=vseagent,name={AGENT_PORT_NAME}"),
    ]);
    for (i, d) in profile.disks.iter().enumerate() {
        let ro = if d.readonly { ",readonly=on" } else { "" };
        push(&[
            "-drive",
            &format!(
                "file={},format={},if=virtio,index={i}{ro}",
                opt(&d.path),
                d.format.as_str()
            ),
        ]);
    }
    let net = &profile.network;
    let netdev = match net.mode {
        NetMode::None => None,
        NetMode::User => Some(match &net.hostname {
            Some(h) => format!("user,id=net0,hostname={h}"),
            None => "user,id=net0".to_string(),
        }),
        // Both are descriptors vse opened (`netfd`): the UDP socket bound to `local` and
        // connected to `remote`, the bridge's tap from the bridge helper vse ran.
        NetMode::Udp => Some(format!("dgram,id=net0,local.type=fd,local.str={NET_FD}")),
        NetMode::Bridge => Some(format!("tap,id=net0,fd={NET_FD}")),
    };
    if let Some(nd) = netdev {
        push(&["-netdev", &nd]);
        let mac = net.mac.map(|m| format!(",mac={m}")).unwrap_or_default();
        push(&["-device", &format!("virtio-net-pci,netdev=net0{mac}")]);
    }
    match launch {
        Launch::Fresh => push(&["-S"]),
        Launch::Incoming => push(&["-incoming", "defer"]),
    }
    a
}

/// POSIX-shell rendering of an argv, for humans (`vse vm explain`).
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|s| shell_quote(s))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Disk, DiskFormat, ImageRef, Network};

    fn profile() -> Profile {
        let mut p = Profile::new(
            "vm1".parse().unwrap(),
            2,
            256,
            ImageRef {
                kernel: "/img/vmlinuz".into(),
                initrd: Some("/img/initrd".into()),
                root_disk: None,
                cmdline: "console=ttyS0".into(),
            },
        );
        p.numa_node = Some(0);
        p.disks.push(Disk {
            path: "/ov/vm1.qcow2".into(),
            format: DiskFormat::Qcow2,
            readonly: false,
        });
        p.network = Network {
            mode: NetMode::User,
            mac: Some("52:54:00:00:00:01".parse().unwrap()),
            hostname: Some("n1".parse().unwrap()),
            ..Network::default()
        };
        p
    }

    #[test]
    fn exact_argv() {
        let p = profile();
        let paths = RunPaths::new(Path::new("/run/v2m"), &p);
        let a = argv(
            Path::new("/usr/bin/qemu-system-x86_64"),
            &p,
            &paths,
            Accel::Tcg,
            Launch::Fresh,
        );
        assert_eq!(
            shell_line(&a),
            "/usr/bin/qemu-system-x86_64 -name guest=vm1,debug-threads=on -machine pc,memory-backend=pc.ram \
             -accel tcg,thread=multi -nodefaults -no-user-config -display none -no-reboot \
             -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny -m 256M -smp 2 \
             -device vmgenid,guid=auto -object memory-backend-ram,id=pc.ram,size=256M,host-nodes=0,policy=bind -kernel /img/vmlinuz \
             -initrd /img/initrd -append 'console=ttyS0 hostname=n1' \
             -chardev file,id=serial0,path=/run/v2m/vm1/console.log,append=on -serial chardev:serial0 \
             -qmp unix:/run/v2m/vm1/qmp.sock,server=on,wait=off -device virtio-serial-pci,id=vser0 \
             -chardev socket,id=vseagent,path=/run/v2m/vm1/agent.sock,server=on,wait=off \
             -device virtserialport,bus=vser0.0,chardev=vseagent,name=org.vse.agent.0 \
             -drive file=/ov/vm1.qcow2,format=qcow2,if=virtio,index=0 -netdev user,id=net0,hostname=n1 \
             -device virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01 -S"
        );
        let mut u = p.clone();
        u.network = Network {
            mode: NetMode::Udp,
            mac: Some("02:fb:00:00:00:01".parse().unwrap()),
            local: Some("127.0.0.1:40001".parse().unwrap()),
            remote: Some("127.0.0.1:40000".parse().unwrap()),
            ..Network::default()
        };
        u.validate().unwrap();
        let line = shell_line(&argv(Path::new("q"), &u, &paths, Accel::Tcg, Launch::Fresh));
        assert!(
            line.contains(
                "-netdev dgram,id=net0,local.type=fd,local.str=3 \
                 -device virtio-net-pci,netdev=net0,mac=02:fb:00:00:00:01"
            ),
            "{line}"
        );
        u.network.remote = None;
        assert!(u.validate().is_err());
        let b = argv(Path::new("qemu"), &p, &paths, Accel::Kvm, Launch::Incoming);
        assert!(shell_line(&b).ends_with("-incoming defer"));
        assert!(b.contains(&"kvm".to_string()));
    }

    #[test]
    fn commas_in_paths_are_escaped() {
        let mut p = profile();
        p.console.log = Some("/tmp/a,b.log".into());
        let paths = RunPaths::new(Path::new("/r"), &p);
        let a = argv(Path::new("q"), &p, &paths, Accel::Tcg, Launch::Fresh);
        assert!(a.contains(&"file,id=serial0,path=/tmp/a,,b.log,append=on".to_string()));
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
