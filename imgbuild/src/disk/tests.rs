//! The root disk of a small tree, read back with e2fsprogs' own tools: a consistent file
//! system (every inode checksum right), the build epoch in every time of every file, the
//! recorded owners, modes and device nodes.

use super::write_ext4;
use crate::deb::{Kind, Meta, Records};
use std::process::Command;

const EPOCH: u64 = 1_747_699_200;

fn debugfs_stat(img: &std::path::Path, path: &str) -> String {
    let o = Command::new("debugfs")
        .arg("-R")
        .arg(format!("stat \"{path}\""))
        .arg(img)
        .output()
        .expect("debugfs (e2fsprogs) runs");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_time_is_the_epoch_and_records_win() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
    std::fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool2")).unwrap();
    std::os::unix::fs::symlink("tool", root.join("usr/bin/link")).unwrap();
    let rec = |kind, perm, uid| Meta {
        kind,
        perm,
        uid,
        gid: uid,
    };
    let records: Records = [
        ("/usr/bin/tool".to_string(), rec(Kind::File, 0o4755, 1000)),
        (
            "/dev/null".to_string(),
            rec(Kind::CharDev { major: 1, minor: 3 }, 0o666, 0),
        ),
    ]
    .into();
    let img = tmp.path().join("root.ext4");
    write_ext4(&root, &records, &img, EPOCH, 8).expect("write_ext4");

    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .expect("e2fsck runs");
    assert!(
        fsck.status.success(),
        "e2fsck: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let want = format!("0x{EPOCH:08x}:00000000");
    for path in ["/", "/usr", "/usr/bin/tool", "/usr/bin/link", "/dev/null"] {
        let stat = debugfs_stat(&img, path);
        for field in ["ctime", "atime", "mtime", "crtime"] {
            let line = stat
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{field}:")))
                .unwrap_or_else(|| panic!("{path}: no {field} in {stat}"));
            assert!(line.contains(&want), "{path} {field}: {line}");
        }
    }
    let tool = debugfs_stat(&img, "/usr/bin/tool");
    assert!(tool.contains("Mode:  04755"), "{tool}");
    assert!(tool.contains("User:  1000"), "{tool}");
    assert!(tool.contains("Links: 2"), "{tool}");
    let null = debugfs_stat(&img, "/dev/null");
    assert!(null.contains("Type: character special"), "{null}");
    assert!(null.contains("Mode:  0666"), "{null}");
}
