//! `vse.lock` as written, from a synthetic archive: no host lists, no network, no signatures.
//! A spec and a policy (`golden/synthetic/`) are merged as `vse check` does, turned into the
//! resolver's request as `vse lock` does, and resolved against a hand-written `Packages`
//! index below the repository layer; the lockfile's TOML must equal `golden/synthetic/vse.lock`
//! byte for byte. `VSE_BLESS=1` rewrites it (refused under CI); review the diff like code.
//!
//! The archive exercises what a lock records: the minbase set (Essential and required, one
//! of them with a versioned Pre-Depends), the kernel and the initramfs's busybox, a package a
//! policy requires, a versioned request with two candidates, alternatives (the first one
//! forbidden by the policy), a virtual package with two providers that conflict with each
//! other, an `Architecture: all` dependency, another architecture's copy, and Recommends
//! that are not followed.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use vsec::deb::Arch;
use vsec::index::PackagesIndex;
use vsec::lock::{LockedRepository, Lockfile, Reason, SourceFiles};
use vsec::resolve::{request_for_env, resolve_in};
use vsec::solve::Universe;
use vsec::yaml::Source;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/synthetic")
}

fn source(name: &str) -> Source {
    let path = dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Source::from_bytes(name, &path, bytes)
}

/// The lock of `analysis.vse.yaml` under `site.policy.yaml` against `Packages`.
fn lock() -> Lockfile {
    let spec =
        vsec::spec::parse_source(&source("analysis.vse.yaml")).unwrap_or_else(|d| panic!("{d}"));
    let policy =
        vsec::policy::parse_source(&source("site.policy.yaml")).unwrap_or_else(|d| panic!("{d}"));
    let env = vsec::merge::merge(&spec, &[policy]).unwrap_or_else(|d| panic!("{d}"));
    let packages = std::fs::read_to_string(dir().join("Packages")).unwrap();
    let index = PackagesIndex::parse(Path::new("Packages"), &packages, 0).unwrap();
    let arch = Arch::new("amd64").unwrap();
    let universe = Universe::new(index, &arch);
    let resolution = resolve_in(&universe, &request_for_env(&env, &[])).unwrap();
    let repository = LockedRepository {
        url: "http://mirror.example.org/debian".into(),
        suite: "bookworm".into(),
        components: vec!["main".into()],
        release_date: "Sat, 10 May 2025 08:00:00 UTC".into(),
        release_sha256: hex::encode(Sha256::digest(packages.as_bytes())),
    };
    let source = SourceFiles {
        spec: "analysis.vse.yaml".into(),
        policies: vec!["site.policy.yaml".into()],
    };
    let mut lock = resolution.into_lockfile(env.env_hash(), source, arch, vec![repository]);
    // The writer's version would make every release re-bless the file.
    assert!(lock.generator.starts_with("vse "), "{}", lock.generator);
    lock.generator = "vse (golden test)".into();
    lock
}

#[test]
fn synthetic_archive_locks_to_the_golden_file() {
    let lock = lock();
    let text = lock.to_toml();
    testkit::golden::check(&dir().join("vse.lock"), &text);
    // Same inputs, same bytes; and what is written reads back.
    assert_eq!(self::lock().to_toml(), text);
    assert_eq!(
        Lockfile::from_toml(Path::new("vse.lock"), &text).unwrap(),
        lock
    );
}

/// The choices the golden file records, stated once more so that a careless bless of a
/// wrong resolution still fails.
#[test]
fn the_lock_holds_the_expected_choices() {
    let lock = lock();
    let find = |name: &str| lock.packages.iter().find(|p| p.name.as_str() == name);
    let version = |name: &str| find(name).map(|p| p.version.to_string());
    let reason = |name: &str| find(name).map(|p| p.reason.clone());
    // The request's constraint picks the newer python3 of two.
    assert_eq!(version("python3").as_deref(), Some("3.11.2-1+b1"));
    // `libmpich12 | libopenmpi3`: the first alternative is forbidden by the policy, and the
    // virtual mpi-default-bin is Open MPI's, since MPICH's conflicts with the request.
    assert_eq!(find("libmpich12"), None);
    assert_eq!(find("mpich"), None);
    assert!(find("libopenmpi3").is_some() && find("openmpi-common").is_some());
    // python3-numpy-abi9 is provided by python3-numpy; the serial HDF5 is the first choice.
    assert!(find("python3-numpy").is_some() && find("libhdf5-103-1").is_some());
    assert_eq!(find("libhdf5-openmpi-103-1"), None);
    // Recommends are not followed; the i386 libc6 is another architecture.
    assert_eq!(find("firmware-linux-free"), None);
    assert!(
        lock.packages
            .iter()
            .all(|p| p.architecture.as_str() != "i386")
    );
    assert_eq!(
        reason("libnuma1"),
        Some(Reason::Policy {
            policy: "site.policy.yaml".into()
        })
    );
    assert_eq!(reason("linux-image-cloud-amd64"), Some(Reason::Kernel));
    assert_eq!(reason("busybox-static"), Some(Reason::Initramfs));
    assert_eq!(
        reason("dash"),
        Some(Reason::Base {
            variant: "minbase".into()
        })
    );
    assert_eq!(
        reason("kmod"),
        Some(Reason::Dependency {
            of: vsec::deb::PackageName::new("linux-image-6.1.0-18-cloud-amd64").unwrap()
        })
    );
    assert_eq!(lock.packages.len(), 17, "{:#?}", lock.packages);
}
