//! The memory hog of the tests: `vse-test-hog CGROUP_DIR PATTERN` moves itself into the
//! cgroup, then holds touched anonymous memory, re-touching it so it stays active. PATTERN is
//! `N` (hold N MiB) or `A-B` (noise: a random size in [A, B] MiB, changing every 100-300 ms).
//! Prints `HOG-READY <MiB>` once the first block is resident; runs until killed.

use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, pattern] = args.as_slice() else {
        eprintln!("usage: vse-test-hog CGROUP_DIR N|A-B");
        std::process::exit(2);
    };
    let procs = std::path::Path::new(dir).join("cgroup.procs");
    if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
        eprintln!("vse-test-hog: cannot join {}: {e}", procs.display());
        std::process::exit(1);
    }
    let Some((lo, hi)) = parse(pattern) else {
        eprintln!("vse-test-hog: bad pattern {pattern:?} (want N or A-B, in MiB)");
        std::process::exit(2);
    };
    hold(lo, hi);
}

fn parse(pattern: &str) -> Option<(usize, usize)> {
    let (lo, hi) = match pattern.split_once('-') {
        Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
        None => {
            let n = pattern.parse().ok()?;
            (n, n)
        }
    };
    (lo <= hi).then_some((lo, hi))
}

fn hold(lo: usize, hi: usize) -> ! {
    let mut seed = u64::from(std::process::id()) | 1;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut held: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let mib = lo + (rand() as usize % (hi - lo + 1));
        // Free the old block first (a large allocation goes back to the kernel at once).
        drop(std::mem::take(&mut held));
        held.resize(mib << 20, 0);
        // Non-zero data in every page: real, resident memory.
        for i in (0..held.len()).step_by(4096) {
            held[i] = (i >> 12) as u8 | 1;
        }
        if first {
            println!("HOG-READY {mib}");
            first = false;
        }
        let rounds = if lo == hi { u64::MAX } else { 1 };
        let pause = if lo == hi { 200 } else { 100 + rand() % 200 };
        for _ in 0..rounds {
            std::thread::sleep(Duration::from_millis(pause));
            for i in (0..held.len()).step_by(4096) {
                held[i] = held[i].wrapping_add(2) | 1;
            }
        }
    }
}
