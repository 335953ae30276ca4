//! Hostile `.deb`s built here byte by byte: every one must fail with a clear error (or be
//! confined to the rootfs), touch nothing outside the build directory, and leave no
//! complete-looking image behind.

use imgbuild::deb::Records;
use imgbuild::progress::Silent;
use imgbuild::rootfs::{RootfsError, unpack_all};
use std::io::Write;
use std::path::{Path, PathBuf};

enum E<'a> {
    File(&'a [u8], &'a [u8], u32),
    Symlink(&'a [u8], &'a [u8]),
    Hardlink(&'a [u8], &'a [u8]),
}

/// A raw tar header, so names the `tar` crate's builder would refuse (`..`, `/abs`) can be made.
fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, data, ty, link, mode): (&[u8], &[u8], tar::EntryType, &[u8], u32) = match e {
            E::File(n, d, m) => (n, d, tar::EntryType::Regular, b"", *m),
            E::Symlink(n, t) => (n, b"", tar::EntryType::Symlink, t, 0o777),
            E::Hardlink(n, t) => (n, b"", tar::EntryType::Link, t, 0o644),
        };
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name);
        gnu.linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(ty);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn deb_with(data_member: (&str, Vec<u8>)) -> Vec<u8> {
    let control = tar_of(&[E::File(
        b"./control",
        b"Package: evil\nVersion: 1\nArchitecture: all\n",
        0o644,
    )]);
    let mut b = ar::Builder::new(Vec::new());
    for (name, data) in [
        ("debian-binary", b"2.0\n".to_vec()),
        ("control.tar.gz", gz(&control)),
        (data_member.0, data_member.1),
    ] {
        let h = ar::Header::new(name.as_bytes().to_vec(), data.len() as u64);
        b.append(&h, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

fn deb(entries: &[E]) -> Vec<u8> {
    deb_with(("data.tar.gz", gz(&tar_of(entries))))
}

struct Setup {
    _tmp: tempfile::TempDir,
    outside: PathBuf,
    root: PathBuf,
    debdir: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    let root = tmp.path().join("build/rootfs");
    let debdir = tmp.path().join("debs");
    for d in [&outside, &root, &debdir] {
        std::fs::create_dir_all(d).unwrap();
    }
    Setup {
        outside,
        root,
        debdir,
        _tmp: tmp,
    }
}

fn unpack(s: &Setup, bytes: Vec<u8>, limit: u64) -> Result<Records, RootfsError> {
    let p = s.debdir.join("evil.deb");
    std::fs::write(&p, bytes).unwrap();
    let d = imgbuild::deb::DebFile::hashed(p).unwrap();
    unpack_all(&s.root, &[("evil".into(), d)], limit, &Silent).map(|(r, _)| r)
}

fn assert_untouched(outside: &Path) {
    assert_eq!(
        std::fs::read_dir(outside).unwrap().count(),
        0,
        "something landed outside"
    );
}

#[test]
fn dot_dot_is_refused() {
    let s = setup();
    let rel = "./../../outside/pwned";
    let e = unpack(&s, deb(&[E::File(rel.as_bytes(), b"x", 0o644)]), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("contains `..`"), "{e}");
    assert_untouched(&s.outside);
}

#[test]
fn absolute_paths_are_refused() {
    let s = setup();
    let abs = format!("{}/pwned", s.outside.display());
    let e = unpack(&s, deb(&[E::File(abs.as_bytes(), b"x", 0o644)]), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("is absolute"), "{e}");
    assert_untouched(&s.outside);
}

#[test]
fn symlink_escapes_stay_inside_the_rootfs() {
    let s = setup();
    let target = s.outside.to_string_lossy().into_owned();
    let records = unpack(
        &s,
        deb(&[
            E::Symlink(b"./escape", target.as_bytes()),
            E::File(b"./escape/pwned", b"x", 0o644),
            E::Symlink(b"./up", b"../../../../../../.."),
            E::File(b"./up/etc-pwned", b"y", 0o644),
        ]),
        1 << 20,
    )
    .unwrap();
    assert_untouched(&s.outside);
    // The symlink is resolved as the guest would: inside the rootfs.
    let confined = s.root.join(target.trim_start_matches('/')).join("pwned");
    assert_eq!(std::fs::read(confined).unwrap(), b"x");
    assert_eq!(std::fs::read(s.root.join("etc-pwned")).unwrap(), b"y");
    // Metadata is keyed by where the file landed inside the image.
    assert!(
        records.contains_key(&format!("{target}/pwned")),
        "{records:?}"
    );
    assert!(records.contains_key("/etc-pwned"));
}

#[test]
fn hardlinks_cannot_reach_outside_files() {
    let s = setup();
    std::fs::write(s.outside.join("secret"), "s").unwrap();
    let target = format!("{}/secret", s.outside.display());
    let e = unpack(
        &s,
        deb(&[E::Hardlink(b"./stolen", target.as_bytes())]),
        1 << 20,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is absolute"), "{e}");
    let e = unpack(
        &s,
        deb(&[E::Hardlink(b"./stolen2", b"../outside/secret")]),
        1 << 20,
    )
    .unwrap_err();
    assert!(e.to_string().contains("contains `..`"), "{e}");
    assert!(!s.root.join("stolen").exists());
}

#[test]
fn setuid_bits_are_recorded_not_applied() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let records = unpack(&s, deb(&[E::File(b"./usr/bin/su", b"#!", 0o4755)]), 1 << 20).unwrap();
    assert_eq!(records["/usr/bin/su"].perm, 0o4755);
    let host = std::fs::metadata(s.root.join("usr/bin/su")).unwrap();
    assert_eq!(
        host.permissions().mode() & 0o7000,
        0,
        "setuid reached the host"
    );
}

#[test]
fn metadata_follows_merged_usr_aliases() {
    // bookworm's util-linux ships `./bin/su` setuid; in the merged-/usr image it is /usr/bin/su
    // and that is the path the ext4 and tar writers look up.
    let s = setup();
    let records = unpack(&s, deb(&[E::File(b"./bin/su", b"#!", 0o4755)]), 1 << 20).unwrap();
    assert_eq!(records["/usr/bin/su"].perm, 0o4755);
    assert!(!records.contains_key("/bin/su"));
    assert!(s.root.join("usr/bin/su").is_file());
}

#[test]
fn oversized_members_are_refused() {
    let s = setup();
    let big = vec![0u8; 4 << 20];
    let e = unpack(&s, deb(&[E::File(b"./big", &big, 0o644)]), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("unpacks to more than"), "{e}");
    // An ar member that claims more bytes than the file holds.
    let mut bytes = deb(&[E::File(b"./x", b"x", 0o644)]);
    let at = bytes
        .windows(11)
        .rposition(|w| w == b"data.tar.gz")
        .unwrap();
    bytes[at + 48..at + 58].copy_from_slice(b"9999999999");
    let e = unpack(&s, bytes, 1 << 20).unwrap_err();
    assert!(e.to_string().contains("declares 9999999999 bytes"), "{e}");
}

#[test]
fn corrupted_compression_is_a_clear_error() {
    let s = setup();
    let mut data = gz(&tar_of(&[E::File(b"./x", &[7u8; 100_000], 0o644)]));
    let mid = data.len() / 2;
    for b in &mut data[mid..mid + 64] {
        *b ^= 0xa5;
    }
    let e = unpack(&s, deb_with(("data.tar.gz", data)), 1 << 30).unwrap_err();
    assert!(e.to_string().contains("is corrupt"), "{e}");
    let e = unpack(
        &s,
        deb_with(("data.tar.xz", b"not xz at all".to_vec())),
        1 << 30,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is corrupt"), "{e}");
    let e = unpack(&s, deb_with(("data.tar.bz9", b"?".to_vec())), 1 << 30).unwrap_err();
    assert!(e.to_string().contains("unknown compression"), "{e}");
}

/// A `.deb` swapped in the cache after it was verified (same name, another valid archive, or
/// the same one with bytes appended) is refused: the hash is taken over the bytes unpacked.
#[test]
fn a_deb_changed_after_verification_is_refused() {
    let s = setup();
    let p = s.debdir.join("pkg.deb");
    std::fs::write(&p, deb(&[E::File(b"./etc/good", b"verified\n", 0o644)])).unwrap();
    let verified = imgbuild::deb::DebFile::hashed(p.clone()).unwrap();
    let named = [("pkg".to_string(), verified.clone())];
    unpack_all(&s.root, &named, 1 << 20, &Silent).expect("the verified file unpacks");

    for forged in [
        deb(&[E::File(b"./etc/good", b"forged!!!\n", 0o644)]),
        [std::fs::read(&p).unwrap(), b"trailing".to_vec()].concat(),
    ] {
        std::fs::write(&p, &forged).unwrap();
        let root = s.root.with_file_name("rootfs-2");
        let e = unpack_all(&root, &named, 1 << 20, &Silent).unwrap_err();
        assert!(
            matches!(e, RootfsError::Deb(imgbuild::deb::DebError::Changed { .. })),
            "{e}"
        );
        assert!(e.to_string().contains(&verified.sha256), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
    assert_untouched(&s.outside);
}
