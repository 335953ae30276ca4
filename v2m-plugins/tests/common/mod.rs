//! Shared helpers of the V2M integration tests: profiles of the test guest (from `testkit`),
//! and waiting on its serial console.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};
use v2m::{ImageRef, Profile, Vm};

/// The test guest of `.ci/fixtures.sh` (prints VSE-READY, then VSE-COUNT n every 100 ms).
pub use testkit::fixture::{Guest as Fixture, test_guest as fixture};

/// QEMU is installed (or the test is skipped / fails under `VSE_REQUIRE_ALL=1`).
pub fn qemu_available() -> bool {
    testkit::require(
        v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).is_some(),
        "qemu-system-x86_64",
        "apt-get install qemu-system-x86",
    )
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
    testkit::fixture::counters(&vm.console_log().unwrap())
        .last()
        .copied()
}

/// Waits until the counter passed `after`.
pub fn wait_counter_above(vm: &dyn Vm, after: u64) {
    wait_console(
        vm,
        Duration::from_secs(180),
        &format!("a counter above {after}"),
        |l| {
            testkit::fixture::counters(l)
                .last()
                .is_some_and(|&c| c > after)
        },
    );
}
