//! The index cache against its faults: a Release re-signed with the same indices (reused),
//! changed indices (a new file), files cut short, damaged, written by another format or for
//! another architecture (rebuilt, never trusted), a damaged record met mid-solve (answer
//! thrown away, file rebuilt), an unusable directory (no cache, with a note). Archives are
//! real signed `file://` trees made here with a throwaway key; the last test compares the
//! cached and the parsed universe on the host's real Debian indices.

mod apt_oracle_common;

use pgp::composed::{CleartextSignedMessage, KeyType, SecretKeyParamsBuilder, SignedSecretKey};
use rand::SeedableRng;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use vsec::deb::{Arch, parse_relation};
use vsec::lock::Reason;
use vsec::repo::{Location, RetryPolicy, SignedBy, SourceEntry, ValidityCheck};
use vsec::resolve::{
    BaseVariant, IndexCacheNote, RepoConfig, RequestedPackage, ResolveError, ResolveRequest,
    load_universe, load_universe_cached, resolve_in,
};
use vsec::solve::{Catalog, Provider};

/// A signed archive with one suite and component, rewritten at will.
struct Archive {
    root: PathBuf,
    key: SignedSecretKey,
    rng: rand::rngs::StdRng,
}

fn sha256(data: &[u8]) -> String {
    vsec::repo::fetch::sha256_hex(data)
}

fn stanza(name: &str, version: &str, arch: &str, depends: &str) -> String {
    let deb = format!("{name}_{version}_{arch}.deb");
    let mut s = format!(
        "Package: {name}\nVersion: {version}\nArchitecture: {arch}\nPriority: optional\nFilename: pool/main/{deb}\nSize: 100\nSHA256: {}\n",
        sha256(deb.as_bytes())
    );
    if !depends.is_empty() {
        s.push_str(&format!("Depends: {depends}\n"));
    }
    s
}

impl Archive {
    fn new(root: &Path) -> Archive {
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        let key = SecretKeyParamsBuilder::default()
            .key_type(KeyType::Ed25519Legacy)
            .can_sign(true)
            .primary_user_id("vse test archive <archive@example.org>".into())
            .build()
            .unwrap()
            .generate(&mut rng)
            .unwrap()
            .sign(&mut rng, &"".into())
            .unwrap();
        let public = key
            .signed_public_key()
            .to_armored_string(Default::default())
            .unwrap();
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(root.join("key.asc"), public).unwrap();
        Archive {
            root: root.to_path_buf(),
            key,
            rng,
        }
    }

    fn keyring(&self) -> PathBuf {
        self.root.join("key.asc")
    }

    /// Writes the indices (`arch` → stanzas) and a freshly signed InRelease dated `date`.
    fn publish(&mut self, indices: &[(&str, String)], date: &str) {
        let dists = self.root.join("debian/dists/stable");
        let mut release = format!(
            "Origin: vse test\nSuite: stable\nCodename: stable\nDate: {date}\nComponents: main\nSHA256:\n"
        );
        for (arch, text) in indices {
            let rel = format!("main/binary-{arch}/Packages");
            std::fs::create_dir_all(dists.join(format!("main/binary-{arch}"))).unwrap();
            std::fs::write(dists.join(&rel), text).unwrap();
            release.push_str(&format!(
                " {} {} {rel}\n",
                sha256(text.as_bytes()),
                text.len()
            ));
        }
        let msg = CleartextSignedMessage::sign(
            &mut self.rng,
            &release,
            &self.key.primary_key,
            &"".into(),
        )
        .unwrap();
        std::fs::write(
            dists.join("InRelease"),
            msg.to_armored_string(Default::default()).unwrap(),
        )
        .unwrap();
    }

    fn config(&self, arch: &str, index_cache: &Path) -> RepoConfig {
        RepoConfig {
            sources: vec![SourceEntry {
                uri: format!("file://{}/debian", self.root.display()),
                suite: "stable".into(),
                components: vec!["main".into()],
                signed_by: SignedBy::Keyrings(vec![self.keyring()]),
                origin: "test".into(),
            }],
            location: Location::Remote,
            mirror_rewrites: vec![],
            arch: Arch::new(arch).unwrap(),
            keyrings: vec![],
            validity: ValidityCheck::Ignore,
            snapshot: None,
            cache_dir: None,
            index_cache: Some(index_cache.to_path_buf()),
            retry: RetryPolicy::default(),
        }
    }
}

const DATE: &str = "Sat, 10 May 2025 08:00:00 UTC";

fn amd64_index(tool_version: &str) -> String {
    [
        stanza("tool", tool_version, "amd64", "libtool1 (>= 1.0)"),
        stanza("libtool1", "1.2-1", "amd64", ""),
        stanza("libtool1", "1.0-1", "amd64", ""),
        stanza("other", "3", "all", ""),
    ]
    .join("\n")
}

fn request(name: &str) -> ResolveRequest {
    ResolveRequest {
        variant: BaseVariant::Essential,
        recommends: false,
        packages: vec![RequestedPackage {
            relation: parse_relation(name).unwrap(),
            reason: Reason::Requested,
        }],
        forbidden: vec![],
    }
}

/// Loads through the cache and resolves `tool`: (package `name version` list, note).
fn lock_tool(cfg: &RepoConfig) -> (Vec<String>, IndexCacheNote, String) {
    let l = load_universe_cached(cfg, None).unwrap();
    let r = resolve_in(&*l.universe, &request("tool")).unwrap();
    let pkgs = r
        .packages
        .iter()
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();
    (pkgs, l.note, l.repositories[0].release_sha256.clone())
}

fn cache_file(note: &IndexCacheNote) -> PathBuf {
    note.path().expect("a cache file").to_path_buf()
}

#[test]
fn resigned_release_reuses_and_changed_indices_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Archive::new(&dir.path().join("archive"));
    a.publish(&[("amd64", amd64_index("2.0-1"))], DATE);
    let cache = dir.path().join("cache/index");
    let cfg = a.config("amd64", &cache);
    let (first, note, release1) = lock_tool(&cfg);
    assert!(matches!(note, IndexCacheNote::Built { .. }), "{note:?}");
    assert_eq!(first, ["libtool1 1.2-1", "tool 2.0-1"]);
    let file = cache_file(&note);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&cache), mode(&file)), (0o700, 0o600));

    let (again, note, _) = lock_tool(&cfg);
    assert_eq!(note, IndexCacheNote::Reused { path: file.clone() });
    assert_eq!(again, first);

    // Same indices, new signature and date: provably the same content, reused; the lock's
    // repository entry follows the new Release file.
    a.publish(
        &[("amd64", amd64_index("2.0-1"))],
        "Sun, 11 May 2025 08:00:00 UTC",
    );
    let (resigned, note, release2) = lock_tool(&cfg);
    assert_eq!(note, IndexCacheNote::Reused { path: file.clone() });
    assert_eq!(resigned, first);
    assert_ne!(
        release1, release2,
        "the new InRelease is what the lock names"
    );

    // A changed index is a new file, and the solver sees the new version.
    a.publish(&[("amd64", amd64_index("2.1-1"))], DATE);
    let (changed, note, _) = lock_tool(&cfg);
    assert!(matches!(note, IndexCacheNote::Built { .. }), "{note:?}");
    assert_ne!(cache_file(&note), file);
    assert_eq!(changed, ["libtool1 1.2-1", "tool 2.1-1"]);
}

/// Damages the cache file with `f`, then checks that the next load rebuilds it for `why`
/// and resolves as before.
fn rebuilt_after(cfg: &RepoConfig, want: &[String], why: &str, f: &dyn Fn(&mut Vec<u8>)) {
    let (_, note, _) = lock_tool(cfg);
    let file = cache_file(&note);
    let mut bytes = std::fs::read(&file).unwrap();
    f(&mut bytes);
    std::fs::write(&file, &bytes).unwrap();
    let (got, note, _) = lock_tool(cfg);
    match &note {
        IndexCacheNote::Rebuilt { path, reason } => {
            assert_eq!(path, &file);
            assert!(reason.contains(why), "{why}: {reason}");
        }
        other => panic!("{why}: expected a rebuild, got {other:?}"),
    }
    assert_eq!(got, want, "{why}");
    let (_, note, _) = lock_tool(cfg);
    assert!(
        matches!(note, IndexCacheNote::Reused { .. }),
        "{why}: {note:?}"
    );
}

#[test]
fn damaged_or_foreign_files_are_rebuilt_never_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Archive::new(&dir.path().join("archive"));
    a.publish(
        &[
            ("amd64", amd64_index("2.0-1")),
            ("arm64", stanza("tool", "9.9-1", "arm64", "")),
        ],
        DATE,
    );
    let cache = dir.path().join("cache");
    let cfg = a.config("amd64", &cache);
    let want = lock_tool(&cfg).0;
    let header_at = |b: &mut Vec<u8>, at: usize, v: u8| b[at] = v;
    rebuilt_after(&cfg, &want, "truncated", &|b| b.truncate(b.len() / 2));
    rebuilt_after(&cfg, &want, "truncated", &|b| b.truncate(100));
    // A crash after the rename cannot leave a short file (the temporary file is renamed
    // only when whole), but a short file for any other reason is caught by its length.
    rebuilt_after(&cfg, &want, "cache format 0", &|b| {
        b[8..12].copy_from_slice(&0u32.to_le_bytes())
    });
    rebuilt_after(&cfg, &want, "header checksum", &|b| {
        header_at(b, 50, b[50] ^ 1)
    });
    rebuilt_after(&cfg, &want, "checksum mismatch in the tables", &|b| {
        let n = b.len();
        b[n - 3] ^= 0x40;
    });
    rebuilt_after(&cfg, &want, "bad magic", &|b| b[0] = b'X');

    // The arm64 file of the same archive, put where the amd64 one belongs.
    let (arm, arm_note, _) = lock_tool(&a.config("arm64", &cache));
    assert_eq!(arm, ["tool 9.9-1"]);
    let arm_file = std::fs::read(cache_file(&arm_note)).unwrap();
    rebuilt_after(&cfg, &want, "key mismatch", &|b| *b = arm_file.clone());

    // A writer that died mid-write leaves only its temporary file: ignored.
    std::fs::write(cache.join(".index-crashed"), b"VSEINDEX partial").unwrap();
    let (got, note, _) = lock_tool(&cfg);
    assert!(matches!(note, IndexCacheNote::Reused { .. }), "{note:?}");
    assert_eq!(got, want);
}

#[test]
fn a_damaged_record_met_mid_solve_voids_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Archive::new(&dir.path().join("archive"));
    a.publish(&[("amd64", amd64_index("2.0-1"))], DATE);
    let cfg = a.config("amd64", &dir.path().join("cache"));
    let (want, note, _) = lock_tool(&cfg);
    let file = cache_file(&note);
    // Damage the record of `libtool1 1.2-1`: the tables still check, the record does not.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(5)
        .position(|w| w == b"1.2-1")
        .expect("the version is stored in the file");
    bytes[at + 2] = b'9';
    std::fs::write(&file, &bytes).unwrap();
    let l = load_universe_cached(&cfg, None).unwrap();
    assert!(matches!(l.note, IndexCacheNote::Reused { .. }));
    let e = resolve_in(&*l.universe, &request("tool")).unwrap_err();
    let ResolveError::DamagedCache(why) = e else {
        panic!("expected DamagedCache, got {e}");
    };
    assert!(why.contains("checksum"), "{why}");
    // What `vse lock` does next: rebuild, resolve again.
    drop(l);
    let l = load_universe_cached(&cfg, Some(&why)).unwrap();
    assert!(matches!(&l.note, IndexCacheNote::Rebuilt { reason, .. } if *reason == why));
    let r = resolve_in(&*l.universe, &request("tool")).unwrap();
    let got: Vec<String> = r
        .packages
        .iter()
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn an_unusable_cache_directory_means_no_cache_and_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Archive::new(&dir.path().join("archive"));
    a.publish(&[("amd64", amd64_index("2.0-1"))], DATE);
    // Root may write anywhere, so the directory is made impossible: a file is in the way.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let (got, note, _) = lock_tool(&a.config("amd64", &blocker.join("index")));
    assert_eq!(got, ["libtool1 1.2-1", "tool 2.0-1"]);
    match note {
        IndexCacheNote::Off { reason } => assert!(reason.contains("cannot use"), "{reason}"),
        other => panic!("expected no cache, got {other:?}"),
    }
}

/// The host's real indices: every package decoded from the cache equals the parsed one, and
/// large requests resolve to the same locks either way.
#[test]
fn cached_and_parsed_universes_agree_on_real_indices() {
    use apt_oracle_common::*;
    if !host_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = host_config();
    cfg.index_cache = Some(dir.path().to_path_buf());
    let (parsed, _) = load_universe(&cfg).unwrap();
    let built = load_universe_cached(&cfg, None).unwrap();
    assert!(
        matches!(built.note, IndexCacheNote::Built { .. }),
        "{:?}",
        built.note
    );
    drop(built);
    let cached = load_universe_cached(&cfg, None).unwrap();
    assert!(
        matches!(cached.note, IndexCacheNote::Reused { .. }),
        "{:?}",
        cached.note
    );
    let c = &*cached.universe;
    for req in [
        "openmpi-bin libopenmpi-dev lammps",
        "python3-scipy python3-matplotlib",
        "build-essential gfortran cmake",
        "no-such-package-here",
    ] {
        let mut r = request("bash");
        r.variant = BaseVariant::Minbase;
        r.packages = req
            .split(' ')
            .map(|n| RequestedPackage {
                relation: parse_relation(n).unwrap(),
                reason: Reason::Requested,
            })
            .collect();
        let a = resolve_in(&parsed, &r).map(|r| r.packages);
        let b = resolve_in(c, &r).map(|r| r.packages);
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{req}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{req}"),
            (a, b) => panic!("{req}: parsed {a:?}, cached {b:?}"),
        }
    }
    assert_eq!(Catalog::len(c), parsed.len());
    for id in 0..parsed.len() as u32 {
        assert_eq!(
            format!("{:?}", parsed.package(id)),
            format!("{:?}", c.package(id)),
            "package {id}"
        );
    }
    assert_eq!(c.fault(), None);
    let mut names = Catalog::names(&parsed);
    let mut cnames = c.names();
    names.sort_unstable();
    cnames.sort_unstable();
    assert_eq!(names, cnames);
}
