//! Shared helpers of the V2M integration tests: the fixture guest, skip/require logic, counter
//! parsing from the serial console, and process checks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use v2m::{ImageRef, Profile, Vm};

/// `VSE_REQUIRE_ALL=1` (CI) turns a missing component into a failure instead of a skip.
pub fn skip_or_fail(why: &str) {
    if std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("required component missing (VSE_REQUIRE_ALL=1): {why}");
    }
    eprintln!("skipped: {why}");
}

pub struct Fixture {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
}

/// The guest from `.ci/fixtures.sh` (prints VSE-READY, then VSE-COUNT n every 100 ms).
pub fn fixture() -> Option<Fixture> {
    let cache = std::env::var("VSE_CACHE").unwrap_or_else(|_| "/var/cache/vse".into());
    let env = Path::new(&cache).join("fixtures/fixtures.env");
    let Ok(text) = std::fs::read_to_string(&env) else {
        skip_or_fail(&format!(
            "no test guest at {} (run .ci/fixtures.sh)",
            env.display()
        ));
        return None;
    };
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(|v| v.trim_matches('"').to_string())
    };
    let f = Fixture {
        kernel: get("VSE_FIXTURE_KERNEL")?.into(),
        initrd: get("VSE_FIXTURE_INITRD")?.into(),
        cmdline: get("VSE_FIXTURE_CMDLINE")?,
    };
    if !f.kernel.is_file() || !f.initrd.is_file() {
        skip_or_fail("fixture files missing (run .ci/fixtures.sh)");
        return None;
    }
    Some(f)
}

pub fn qemu_available() -> bool {
    if v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).is_none() {
        skip_or_fail("qemu-system-x86_64 not installed");
        return false;
    }
    true
}

/// A unique VM name per test and process (tests run in parallel).
pub fn unique_name(tag: &str) -> v2m::VmName {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t{}-{}-{tag}", std::process::id(), n)
        .parse()
        .unwrap()
}

pub fn profile(f: &Fixture, tag: &str, memory_mib: u64) -> Profile {
    Profile::new(
        unique_name(tag),
        1,
        memory_mib,
        ImageRef {
            kernel: f.kernel.clone(),
            initrd: Some(f.initrd.clone()),
            root_disk: None,
            cmdline: f.cmdline.clone(),
        },
    )
}

/// Every counter value printed in `log`, in order.
pub fn counters(log: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(log)
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("VSE-COUNT ")
                .and_then(|n| n.trim().parse().ok())
        })
        .collect()
}

pub fn assert_consecutive(c: &[u64], what: &str) {
    for w in c.windows(2) {
        assert_eq!(
            w[1],
            w[0] + 1,
            "{what}: counter jumps from {} to {} (full: {c:?})",
            w[0],
            w[1]
        );
    }
}

/// Polls `vm`'s console until `pred` holds on it; panics with the log tail after `limit`.
pub fn wait_console(vm: &dyn Vm, limit: Duration, what: &str, pred: impl Fn(&[u8]) -> bool) {
    let start = Instant::now();
    loop {
        let log = vm.console_log().expect("console log readable");
        if pred(&log) {
            return;
        }
        if start.elapsed() > limit {
            let text = String::from_utf8_lossy(&log);
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            panic!(
                "timed out after {limit:?} waiting for {what}; console tail (newest first): {tail:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn wait_ready(vm: &dyn Vm) {
    wait_console(vm, Duration::from_secs(300), "VSE-READY", |l| {
        String::from_utf8_lossy(l).contains("VSE-READY")
    });
}

pub fn last_counter(vm: &dyn Vm) -> Option<u64> {
    counters(&vm.console_log().unwrap()).last().copied()
}

/// Waits until the counter passed `after`.
pub fn wait_counter_above(vm: &dyn Vm, after: u64) {
    wait_console(
        vm,
        Duration::from_secs(180),
        &format!("a counter above {after}"),
        |l| counters(l).last().is_some_and(|&c| c > after),
    );
}

/// QEMU processes whose command line names this VM (`-name guest=NAME,`).
pub fn qemu_processes(name: &str) -> Vec<u32> {
    let needle = format!("guest={name},");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z'));
        if !zombie
            && String::from_utf8_lossy(&cmd)
                .split('\0')
                .any(|a| a == needle || a.starts_with(&needle))
        {
            out.push(pid);
        }
    }
    out
}

pub fn kill9(pid: u32) {
    // SAFETY: kill(2) on a pid the test just read from the VM it owns.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}
