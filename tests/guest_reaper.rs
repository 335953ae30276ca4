//! In a booted VM the guest agent is PID 1, so every orphan ends up as its child: it must reap
//! them. One `vse run` (each boots a fresh VM) starts 50 orphans that report their parent and
//! exit on their own, waits until none is left running, then counts the zombies in the guest.

mod support;

use support::vm::{accel_note, built_image, no_qemu_left, vm_slot, vm_tools};

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

#[test]
fn orphans_in_the_guest_are_reaped_by_the_agent() {
    if !vm_tools() {
        return;
    }
    // The shared minimal image: rebuilt whenever the agent embedded in this `vse` changes.
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
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
