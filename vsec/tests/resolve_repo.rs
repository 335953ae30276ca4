//! Repository access with real Debian data: signatures, Valid-Until, hashes, truncation,
//! http(s) + by-hash + the content cache (offline rerun), unreachable mirrors.
//! The data is the host's apt lists (real InRelease files signed by Debian).

mod apt_oracle_common;

use apt_oracle_common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vsec::deb::Arch;
use vsec::repo::compress::{Compression, decompress};
use vsec::repo::{
    Cache, Fetcher, Keyring, LoadOptions, Location, RepoError, RetryPolicy, SignedBy, SourceEntry,
    ValidityCheck, VerifyError, load_repository, verify,
};

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A file of apt's lists by the part of its name after `_dists_` (checked by [`ready`]).
fn lists_file(rest: &str) -> PathBuf {
    testkit::apt::list_file(rest).unwrap_or_else(|| panic!("no {rest} in apt's lists"))
}

/// apt, Debian's keyring and the bookworm and bookworm-updates lists are there.
fn ready() -> bool {
    host_ready()
        && testkit::require(
            Path::new(KEYRING).exists(),
            KEYRING,
            "apt-get install debian-archive-keyring",
        )
        && testkit::apt::require_list_file("bookworm-updates_InRelease").is_some()
        && testkit::apt::require_list_file("bookworm-updates_main_binary-amd64_Packages.lz4")
            .is_some()
}

fn ring() -> Keyring {
    Keyring::load(&[PathBuf::from(KEYRING)]).unwrap()
}

fn opts(cache: Option<&Path>) -> LoadOptions {
    LoadOptions {
        arch: Arch::new("amd64").unwrap(),
        default_keyrings: vec![PathBuf::from(KEYRING)],
        validity: ValidityCheck::Ignore,
        cache: cache.map(Cache::new),
        snapshot: None,
    }
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        timeout: Duration::from_secs(5),
        backoff: Duration::from_millis(20),
    }
}

/// A Debian-layout tree built from the real bookworm-updates files: the signed InRelease
/// and the plain Packages (whose SHA256 the InRelease lists), under by-hash too.
fn archive_tree(root: &Path) {
    let inrel = lists_file("bookworm-updates_InRelease");
    let pk = lists_file("bookworm-updates_main_binary-amd64_Packages.lz4");
    let dists = root.join("debian/dists/bookworm-updates");
    let bin = dists.join("main/binary-amd64");
    std::fs::create_dir_all(bin.join("by-hash/SHA256")).unwrap();
    std::fs::copy(inrel, dists.join("InRelease")).unwrap();
    let plain = decompress(&std::fs::read(pk).unwrap(), Compression::Lz4).unwrap();
    std::fs::write(bin.join("Packages"), &plain).unwrap();
    let h = vsec::repo::fetch::sha256_hex(&plain);
    std::fs::write(bin.join("by-hash/SHA256").join(h), &plain).unwrap();
}

fn entry(uri: String) -> SourceEntry {
    SourceEntry {
        uri,
        suite: "bookworm-updates".into(),
        components: vec!["main".into()],
        signed_by: SignedBy::Default,
        origin: "test".into(),
    }
}

#[test]
fn real_inrelease_verifies_and_a_changed_byte_does_not() {
    if !ready() {
        return;
    }
    let text = std::fs::read_to_string(lists_file("bookworm_InRelease")).unwrap();
    let signed = verify::verify_inrelease("bookworm", &text, &ring()).unwrap();
    assert!(signed.contains("Codename: bookworm"));
    // Change one digit of one hash inside the signed text.
    let pos = text.find("main/binary-amd64/Packages").unwrap() - 20;
    let mut bytes = text.into_bytes();
    bytes[pos] = if bytes[pos] == b'0' { b'1' } else { b'0' };
    let tampered = String::from_utf8(bytes).unwrap();
    let e = verify::verify_inrelease("bookworm", &tampered, &ring()).unwrap_err();
    assert!(matches!(e, VerifyError::Bad { .. }), "{e}");
    assert!(e.to_string().contains("BAD SIGNATURE"), "{e}");
    // A keyring that never signed Debian rejects the genuine file too: a key made here.
    let dir = tempfile::tempdir().unwrap();
    let other = Keyring::load(&[throwaway_keyring(dir.path())]).unwrap();
    assert_eq!(other.len(), 1);
    let text = std::fs::read_to_string(lists_file("bookworm_InRelease")).unwrap();
    let e = verify::verify_inrelease("bookworm", &text, &other).unwrap_err();
    assert!(matches!(e, VerifyError::Bad { .. }), "{e}");
}

/// An armored keyring with one freshly generated Ed25519 signing key.
fn throwaway_keyring(dir: &Path) -> PathBuf {
    use pgp::composed::{KeyType, SecretKeyParamsBuilder};
    let mut rng = rand::thread_rng();
    let key = SecretKeyParamsBuilder::default()
        .key_type(KeyType::Ed25519Legacy)
        .can_certify(true)
        .can_sign(true)
        .primary_user_id("vse test key <test@example.invalid>".into())
        .build()
        .unwrap()
        .generate(&mut rng)
        .unwrap()
        .sign(&mut rng, &"".into())
        .unwrap();
    let path = dir.join("throwaway.asc");
    let armored = key
        .signed_public_key()
        .to_armored_string(None.into())
        .unwrap();
    std::fs::write(&path, armored).unwrap();
    path
}

#[test]
fn expired_release_is_rejected_with_its_date() {
    if !ready() {
        return;
    }
    let Some(sec) = testkit::apt::require_list_file("bookworm-security_InRelease") else {
        return;
    };
    let text = std::fs::read_to_string(&sec).unwrap();
    let until_line = text
        .lines()
        .find_map(|l| l.strip_prefix("Valid-Until: "))
        .expect("security InRelease has Valid-Until")
        .to_string();
    let until = vsec::repo::release::parse_date(&until_line).unwrap();
    let name = sec.file_name().unwrap().to_string_lossy().to_string();
    let uri = format!(
        "http://{}",
        name.trim_end_matches("_dists_bookworm-security_InRelease")
            .replace('_', "/")
    );
    let mut e = entry(uri);
    e.suite = "bookworm-security".into();
    let mut o = opts(None);
    o.validity = ValidityCheck::At(until + chrono::Duration::days(1));
    let err = load_repository(
        &e,
        &Location::AptLists(lists()),
        &o,
        &mut Fetcher::new(quick_retry()),
        0,
    )
    .unwrap_err();
    assert!(matches!(err, RepoError::Expired { .. }), "{err}");
    assert!(err.to_string().contains(&until_line), "{err}");
    o.validity = ValidityCheck::At(until - chrono::Duration::days(1));
    let ok = load_repository(
        &e,
        &Location::AptLists(lists()),
        &o,
        &mut Fetcher::new(quick_retry()),
        0,
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
}

#[test]
fn file_tree_loads_and_corruption_is_caught() {
    if !ready() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    archive_tree(d.path());
    let uri = format!("file://{}/debian", d.path().display());
    let mut f = Fetcher::new(quick_retry());
    let r = load_repository(
        &entry(uri.clone()),
        &Location::Remote,
        &opts(None),
        &mut f,
        0,
    )
    .unwrap();
    assert!(!r.index.packages.is_empty());
    assert_eq!(r.locked.release_sha256.len(), 64);
    // Corrupt one byte of every copy of Packages: hash mismatch, nothing loaded.
    let bin = d
        .path()
        .join("debian/dists/bookworm-updates/main/binary-amd64");
    let mut files = vec![bin.join("Packages")];
    files.extend(
        std::fs::read_dir(bin.join("by-hash/SHA256"))
            .unwrap()
            .map(|e| e.unwrap().path()),
    );
    for p in &files {
        let mut b = std::fs::read(p).unwrap();
        b[100] ^= 0x20;
        std::fs::write(p, &b).unwrap();
    }
    let e = load_repository(
        &entry(uri.clone()),
        &Location::Remote,
        &opts(None),
        &mut f,
        0,
    )
    .unwrap_err();
    assert!(matches!(e, RepoError::HashMismatch { .. }), "{e}");
    // Truncated: the size no longer matches either.
    for p in &files {
        let b = std::fs::read(p).unwrap();
        std::fs::write(p, &b[..b.len() / 2]).unwrap();
    }
    let e = load_repository(&entry(uri), &Location::Remote, &opts(None), &mut f, 0).unwrap_err();
    assert!(e.to_string().contains("hash mismatch"), "{e}");
}

#[test]
fn corrupted_apt_lists_are_caught() {
    if !ready() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let inrel = lists_file("bookworm-updates_InRelease");
    let pk = lists_file("bookworm-updates_main_binary-amd64_Packages.lz4");
    let name = inrel.file_name().unwrap().to_string_lossy().to_string();
    std::fs::copy(&inrel, d.path().join(&name)).unwrap();
    let plain = decompress(&std::fs::read(&pk).unwrap(), Compression::Lz4).unwrap();
    let mut bad = plain.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x01;
    let pname = pk
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches(".lz4")
        .to_string();
    std::fs::write(d.path().join(&pname), &bad).unwrap();
    let uri = format!(
        "http://{}",
        name.trim_end_matches("_dists_bookworm-updates_InRelease")
            .replace('_', "/")
    );
    let loc = Location::AptLists(d.path().to_path_buf());
    let e = load_repository(
        &entry(uri.clone()),
        &loc,
        &opts(None),
        &mut Fetcher::new(quick_retry()),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, RepoError::HashMismatch { .. }), "{e}");
    std::fs::write(d.path().join(&pname), &plain).unwrap();
    load_repository(
        &entry(uri),
        &loc,
        &opts(None),
        &mut Fetcher::new(quick_retry()),
        0,
    )
    .unwrap();
}

#[test]
fn http_by_hash_then_offline_from_the_warm_cache() {
    if !ready() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    archive_tree(d.path());
    let cache = tempfile::tempdir().unwrap();
    let served = testkit::http::ServedDir::start(d.path().to_path_buf());
    let uri = format!("{}/debian", served.url);
    let mut f = Fetcher::new(quick_retry());
    let online = load_repository(
        &entry(uri.clone()),
        &Location::Remote,
        &opts(Some(cache.path())),
        &mut f,
        0,
    )
    .unwrap();
    drop(served);
    // The server is gone: the rerun must come from the cache, still verified.
    let mut f = Fetcher::new(quick_retry());
    let offline = load_repository(
        &entry(uri.clone()),
        &Location::Remote,
        &opts(Some(cache.path())),
        &mut f,
        0,
    )
    .unwrap();
    assert_eq!(online.locked, offline.locked);
    assert_eq!(online.index.packages.len(), offline.index.packages.len());
    // Without a cache the same URL is an unreachable mirror, reported after bounded retries.
    let e = load_repository(&entry(uri), &Location::Remote, &opts(None), &mut f, 0).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("unreachable after 3 attempts"), "{msg}");
}
