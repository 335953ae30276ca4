//! In a booted VM the guest agent is PID 1, so every orphan ends up as its child: it must reap
//! them. One `vse run` (each boots a fresh VM) starts 50 orphans that report their parent and
//! exit on their own, waits until none is left running, then counts the zombies in the guest.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::require;
use support::vm::{accel_note, no_qemu_left, vm_slot, vm_tools};

/// Busybox sh in the guest. `read` and `set` parse /proc/PID/stat without forking; the state
/// and parent pid follow the last ") " (the command name may hold spaces).
const SCRIPT: &str = r#"
for i in $(seq 50); do
  (sh -c 'sleep 2; read -r s < /proc/$$/stat; set -- ${s##*") "}; echo "orphan $0 ppid $2"' $i &)
done
scan() {
  live=0 zombies=0
  for f in /proc/[0-9]*/stat; do
    read -r s 2>/dev/null < $f || continue
    set -- ${s##*") "}
    [ "$1" = Z ] && zombies=$((zombies + 1))
    [ "$1" != Z ] && [ "$2" = 1 ] && [ "$f" != /proc/$$/stat ] && live=$((live + 1))
  done
}
n=0
scan
while [ $live -gt 0 ] && [ $n -lt 240 ]; do sleep 0.5; n=$((n + 1)); scan; done
sleep 1
scan
echo "live=$live zombies=$zombies"
exit 3
"#;

/// The minimal image with the agent under test. Built here, not shared: `vse build` keeps an
/// existing image whose lock matches, whichever agent it was baked with.
fn image(tmp: &Path) -> Option<PathBuf> {
    let agent = std::env::var_os("VSE_GUEST_AGENT").map(PathBuf::from);
    if !require(
        "VSE_GUEST_AGENT (run .ci/guest-agent.sh)",
        agent.as_ref().is_some_and(|a| a.exists()),
    ) || !require("mke2fs", Command::new("mke2fs").arg("-V").output().is_ok())
        || !support::host_lists()
    {
        return None;
    }
    let img = tmp.join("img");
    let out = support::vse()
        .arg("build")
        .arg(support::specs().join("minimal.vse.yaml"))
        .arg("--policy")
        .arg(support::specs().join("site.policy.yaml"))
        // apt accepted the host's lists when it fetched them; expiry has its own tests.
        .arg("--allow-expired")
        .arg("-o")
        .arg(&img)
        .env("VSE_GUEST_AGENT", agent.unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vse build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(img)
}

#[test]
fn orphans_in_the_guest_are_reaped_by_the_agent() {
    if !vm_tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(img) = image(tmp.path()) else { return };
    let run_dir = tmp.path().join("run");
    let _slot = vm_slot();
    let o = support::vse()
        .arg("run")
        .arg(&img)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--", "sh", "-c", SCRIPT])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    eprintln!("--- stdout\n{out}--- stderr\n{err}---");
    accel_note(&run_dir);
    // The command's own status still comes through the reaper.
    assert_eq!(o.status.code(), Some(3), "{err}");
    // All 50 ran, and each had been handed to PID 1 (the agent) when it exited.
    for i in 1..=50 {
        assert!(out.contains(&format!("orphan {i} ppid 1\n")), "{out}");
    }
    assert!(out.contains("live=0 zombies=0\n"), "{out}");
    no_qemu_left(&run_dir);
}
