//! A share mounted on this host through the guest's own FUSE file system, wired straight to
//! the host end's server (no VM): what a guest's programs do to a share, checked on the
//! directory behind it. Needs /dev/fuse and root (to mount).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use vse_guest_agent::share::fs::{Remote, ShareFs};
use vse_guest_agent::share::proto::{FsOp, FsResult};
use vse_guest_agent::share::server::{ShareSet, Shared};

struct Direct(ShareSet);

impl Remote for Direct {
    fn call(&self, share: u32, op: FsOp, data: &[u8]) -> (FsResult, Vec<u8>) {
        self.0.handle(share, &op, data, false)
    }
}

fn can_mount() -> bool {
    // SAFETY: a plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && Path::new("/dev/fuse").exists();
    if !ok && std::env::var_os("VSE_REQUIRE_ALL").is_some() {
        panic!("VSE_REQUIRE_ALL: this test needs root and /dev/fuse");
    }
    if !ok {
        eprintln!("SKIP: needs root and /dev/fuse");
    }
    ok
}

fn mount(host: &Path, at: &Path, ro: bool) -> fuser::BackgroundSession {
    let shared = Shared {
        host: host.to_path_buf(),
        guest: at.display().to_string(),
        ro,
        optional: false,
    };
    let set = ShareSet::open(&[shared]).unwrap();
    let fs = ShareFs::new(Arc::new(Direct(set)), 0);
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::DefaultPermissions];
    if ro {
        config.mount_options.push(fuser::MountOption::RO);
    }
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(2);
    fuser::Session::new(fs, at, &config)
        .and_then(fuser::Session::spawn)
        .unwrap()
}

#[test]
fn files_written_through_the_mount_are_on_the_host_byte_exact() {
    if !can_mount() {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let at = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("input.txt"), b"in\n").unwrap();
    std::fs::write(outside.path().join("secret"), b"s").unwrap();
    let _s = mount(host.path(), at.path(), false);
    let m = at.path();
    assert_eq!(std::fs::read(m.join("input.txt")).unwrap(), b"in\n");
    // Bigger than one operation's 128 KiB, not a multiple of it.
    let big: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::create_dir_all(m.join("out/deep")).unwrap();
    std::fs::write(m.join("out/deep/big.bin"), &big).unwrap();
    assert_eq!(
        std::fs::read(host.path().join("out/deep/big.bin")).unwrap(),
        big
    );
    assert_eq!(std::fs::read(m.join("out/deep/big.bin")).unwrap(), big);
    // Appends, rename of a directory with an open file in it, truncate, chmod.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(m.join("out/log"))
            .unwrap();
        writeln!(f, "one").unwrap();
        std::fs::rename(m.join("out"), m.join("done")).unwrap();
        writeln!(f, "two").unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(host.path().join("done/log")).unwrap(),
        "one\ntwo\n"
    );
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.join("done/log"))
        .unwrap();
    f.set_len(3).unwrap();
    std::fs::set_permissions(m.join("done/log"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let meta = std::fs::metadata(host.path().join("done/log")).unwrap();
    assert_eq!((meta.len(), meta.mode() & 0o777), (3, 0o600));
    let mut names: Vec<_> = std::fs::read_dir(m.join("done"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["deep", "log"]);
    // Many entries: listed over several answers.
    std::fs::create_dir(m.join("many")).unwrap();
    for i in 0..1200 {
        std::fs::write(m.join(format!("many/f{i}")), b"").unwrap();
    }
    assert_eq!(std::fs::read_dir(m.join("many")).unwrap().count(), 1200);
    // A symlink out of the share is the guest's to follow, in its own namespace: it names
    // the outside path, and nothing through the share reaches that file.
    std::os::unix::fs::symlink(outside.path().join("secret"), m.join("link")).unwrap();
    assert_eq!(
        std::fs::read_link(m.join("link")).unwrap(),
        outside.path().join("secret")
    );
    std::fs::remove_file(m.join("link")).unwrap();
    std::fs::remove_file(m.join("done/deep/big.bin")).unwrap();
    std::fs::remove_dir(m.join("done/deep")).unwrap();
    assert!(!host.path().join("done/deep").exists());
}

#[test]
fn a_read_only_share_refuses_writes_with_erofs_and_the_host_is_unchanged() {
    if !can_mount() {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let at = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("data"), b"keep").unwrap();
    let _s = mount(host.path(), at.path(), true);
    let e = std::fs::write(at.path().join("data"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = std::fs::write(at.path().join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(std::fs::read(at.path().join("data")).unwrap(), b"keep");
    assert_eq!(std::fs::read(host.path().join("data")).unwrap(), b"keep");
    assert!(!host.path().join("new").exists());
}
