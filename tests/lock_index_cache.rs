//! `vse lock` with the index cache, end to end on the host's real Debian indices: the first
//! run has the cache built in the background (it does not wait for it), the next reuses it with a byte-identical lock, a record damaged
//! under a later run is noticed mid-solve and the lock is made again from the verified
//! indices (still identical), and an unusable cache directory only costs a note.

mod support;

use std::path::Path;
use support::{host_lists, specs, vse};

/// Runs `vse lock --json` with `VSE_CACHE=cache`; returns the JSON document.
fn lock(cache: &Path, out: &Path) -> serde_json::Value {
    let o = vse()
        .env("VSE_CACHE", cache)
        .arg("lock")
        .arg(specs().join("minimal.vse.yaml"))
        .args(["--allow-expired", "--json", "-o"])
        .arg(out)
        .output()
        .expect("vse runs");
    assert!(
        o.status.success(),
        "vse lock: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("one JSON document")
}

fn status(doc: &serde_json::Value) -> &str {
    doc["index_cache"]["status"].as_str().unwrap_or("none")
}

/// A cold lock leaves the cache file to a writer of its own: waits until it is there.
fn written(doc: &serde_json::Value) -> std::path::PathBuf {
    let file = Path::new(doc["index_cache"]["path"].as_str().unwrap()).to_path_buf();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !file.exists() {
        assert!(
            std::time::Instant::now() < end,
            "the background writer never wrote {}",
            file.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    file
}

#[test]
fn lock_builds_reuses_and_survives_a_damaged_cache() {
    if !host_lists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("a.lock"), tmp.path().join("b.lock"));
    let first = lock(&cache, &a);
    assert_eq!(status(&first), "building", "{}", first["index_cache"]);
    written(&first);
    let second = lock(&cache, &b);
    assert_eq!(status(&second), "reused", "{}", second["index_cache"]);
    let want = std::fs::read(&a).unwrap();
    assert_eq!(want, std::fs::read(&b).unwrap(), "cached lock differs");

    // Damage the record of a package every lock of this spec reads.
    let file = Path::new(second["index_cache"]["path"].as_str().unwrap()).to_path_buf();
    let busybox = first["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "busybox-static")
        .expect("busybox-static is locked");
    let needle = busybox["filename"].as_str().unwrap().as_bytes().to_vec();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("the record is in the cache file");
    bytes[at + needle.len() / 2] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    let third = lock(&cache, &b);
    assert_eq!(status(&third), "building", "{}", third["index_cache"]);
    assert!(
        third["index_cache"]["reason"]
            .as_str()
            .unwrap()
            .contains("checksum"),
        "{}",
        third["index_cache"]
    );
    assert_eq!(want, std::fs::read(&b).unwrap(), "lock after the rebuild");
    // The damaged file was removed; a whole new one takes its name.
    written(&third);
    assert_eq!(status(&lock(&cache, &b)), "reused");

    // A cache root that cannot be a directory: no cache, a note, the same lock.
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, b"").unwrap();
    let off = lock(&blocker, &b);
    assert_eq!(status(&off), "off", "{}", off["index_cache"]);
    assert_eq!(want, std::fs::read(&b).unwrap(), "lock without a cache");
}
