//! Builds the minimal image (Debian's required set + busybox-static + the cloud kernel) from
//! real Debian packages, boots it under QEMU (TCG) and checks that the guest agent reports
//! ready and runs `uname -r` with the image's kernel version. Then rebuilds: a cache hit.

use imgbuild::build::{BuildOptions, build};
use imgbuild::progress::Silent;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::process::KillOnDrop;

#[test]
fn minimal_image_builds_boots_and_runs_uname() {
    let Some(agent) = testkit::fixture::env_file("VSE_GUEST_AGENT", "guest-agent.sh") else {
        return;
    };
    testkit::require!(testkit::tool("qemu-system-x86_64"));
    testkit::require!(testkit::tool("mke2fs"));
    let plan = imgbuild::aptplan::plan_from_apt(
        &[
            imgbuild::aptplan::REQUIRED,
            "busybox-static",
            "linux-image-cloud-amd64",
        ],
        1_747_699_200,
    )
    .expect("apt resolves the minimal set");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("img");
    let opts = BuildOptions::new(out.clone(), agent);
    let built = build(&plan, &opts, &Silent).expect("build");
    assert!(!built.cache_hit);
    let m = &built.manifest;
    assert!(
        m.kernel_version.ends_with("-cloud-amd64"),
        "{}",
        m.kernel_version
    );
    for part in ["kernel", "initrd", "root"] {
        assert!(m.part_path(&out, part).unwrap().exists(), "{part}");
    }
    let again = build(&plan, &opts, &Silent).expect("rebuild");
    assert!(again.cache_hit, "unchanged lock must be a cache hit");

    let sock = tmp.path().join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg",
        "-M",
        "pc",
        "-m",
        "512",
        "-nodefaults",
        "-nographic",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(m.part_path(&out, "kernel").unwrap())
    .arg("-initrd")
    .arg(m.part_path(&out, "initrd").unwrap())
    .arg("-append")
    .arg(&m.kernel_cmdline)
    .arg("-drive")
    .arg(format!(
        "file={},format=raw,if=virtio,snapshot=on",
        m.part_path(&out, "root").unwrap().display()
    ))
    .args(["-serial", "file:/dev/null", "-device", "virtio-serial-pci"])
    .arg("-chardev")
    .arg(format!("socket,id=agent,path={}", sock.display()))
    .args([
        "-device",
        "virtserialport,chardev=agent,name=org.vse.agent.0",
    ])
    .stdin(Stdio::null());
    eprintln!("accelerator: TCG (KVM on this machine cannot run Debian kernels)");
    let _vm = KillOnDrop(qemu.spawn().expect("qemu starts"));
    let (conn, _) = listener.accept().unwrap();
    let t = Duration::from_secs(180);
    let client = vse_guest_agent::GuestLink::over(conn, &vse_guest_agent::LinkOptions::new(t))
        .expect("agent ready");
    let out = client.exec(&["uname", "-r"], t).expect("uname runs");
    assert_eq!(out.status, 0, "{out:?}");
    assert_eq!(out.stdout.trim(), m.kernel_version);
    // dpkg's own view: every planned package installed and configured, nothing else.
    let dpkg = client
        .exec(
            &["dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Package}\\n"],
            t,
        )
        .expect("dpkg-query runs");
    assert_eq!(dpkg.status, 0, "dpkg-query failed: {dpkg:?}");
    let mut installed = std::collections::BTreeSet::new();
    for line in dpkg.stdout.lines() {
        let (status, name) = line.split_at_checked(3).unwrap_or((line, ""));
        assert_eq!(
            status, "ii ",
            "{name} is not installed and configured: {line:?}"
        );
        installed.insert(name.to_string());
    }
    let planned: std::collections::BTreeSet<String> =
        plan.packages.iter().map(|p| p.name.clone()).collect();
    assert_eq!(installed, planned, "dpkg's database against the plan");
    client.shutdown(t).unwrap();
}
