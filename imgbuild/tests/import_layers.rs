//! Image layers applied with `imgbuild::import::layers`: whiteouts, opaque directories, hard
//! links, replacement across layers, and the hostile entries that must be refused (nothing may
//! land outside the root). Layers are made here with the `tar` crate.

use imgbuild::deb::{Kind, Records};
use imgbuild::import::layers::{LayerError, apply_layer};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A layer under construction.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    /// Writes `name` into the header as raw bytes, so hostile names (which the `tar` crate's
    /// own setters refuse) can be made.
    fn raw(
        &mut self,
        name: &str,
        ty: tar::EntryType,
        link: Option<&str>,
        data: &[u8],
    ) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(ty);
        h.set_mode(if ty == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        if matches!(ty, tar::EntryType::Char) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }
    fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Directory, None, b"")
    }
    fn file(&mut self, name: &str, data: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Regular, None, data.as_bytes())
    }
    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Symlink, Some(target), b"")
    }
    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Link, Some(target), b"")
    }
    fn bytes(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()))
            .into_inner()
            .unwrap()
    }
}

fn apply(root: &Path, records: &mut Records, layer: &mut Layer) -> Result<(), LayerError> {
    apply_layer(&mut layer.bytes().as_slice(), root, records).map(|_| ())
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn whiteouts_opaque_dirs_and_hard_links() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut rec = Records::new();
    let mut lower = Layer::new();
    lower
        .dir("./")
        .dir("etc/")
        .file("etc/keep", "kept\n")
        .file("etc/gone", "deleted\n")
        .dir("opt/")
        .dir("opt/dir/")
        .file("opt/dir/old1", "old\n")
        .dir("opt/dir/sub/")
        .file("opt/dir/sub/old2", "old\n")
        .dir("dev/")
        .raw("dev/null", tar::EntryType::Char, None, b"")
        .dir("srv/")
        .file("srv/was-a-file", "file\n");
    apply(&root, &mut rec, &mut lower).unwrap();
    assert!(matches!(
        rec["/dev/null"].kind,
        Kind::CharDev { major: 1, minor: 3 }
    ));

    let mut upper = Layer::new();
    upper
        // Written before the opaque marker of its own directory: it stays.
        .file("opt/dir/early", "same layer\n")
        .raw("opt/dir/.wh..wh..opq", tar::EntryType::Regular, None, b"")
        .file("opt/dir/new", "new\n")
        .raw("etc/.wh.gone", tar::EntryType::Regular, None, b"")
        .raw("dev/.wh.null", tar::EntryType::Regular, None, b"")
        .hardlink("etc/hl", "etc/keep")
        .dir("srv/was-a-file/")
        .file("srv/was-a-file/inside", "dir now\n");
    apply(&root, &mut rec, &mut upper).unwrap();

    assert_eq!(names(&root.join("etc")), ["hl", "keep"]);
    assert_eq!(names(&root.join("opt/dir")), ["early", "new"]);
    assert!(!rec.contains_key("/etc/gone") && !rec.contains_key("/opt/dir/sub/old2"));
    assert!(
        !rec.contains_key("/dev/null"),
        "a whiteout removes record-only device nodes"
    );
    let (a, b) = (
        std::fs::metadata(root.join("etc/keep")).unwrap(),
        std::fs::metadata(root.join("etc/hl")).unwrap(),
    );
    assert_eq!(
        (a.ino(), a.nlink()),
        (b.ino(), 2),
        "hard link shares the inode"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("srv/was-a-file/inside")).unwrap(),
        "dir now\n"
    );
    // No whiteout marker is ever materialised.
    assert!(!root.join("etc/.wh.gone").exists() && !root.join("opt/dir/.wh..wh..opq").exists());
}

#[test]
fn hostile_entries_are_refused_and_nothing_escapes() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    type Case = (&'static str, Box<dyn Fn(&mut Layer)>);
    let cases: Vec<Case> = vec![
        (
            "dotdot",
            Box::new(|l: &mut Layer| {
                l.file("../outside/escaped", "x");
            }),
        ),
        (
            "absolute",
            Box::new(|l: &mut Layer| {
                l.file("/tmp/vse-import-absolute-escape", "x");
            }),
        ),
        (
            "symlink-then-write",
            Box::new(|l: &mut Layer| {
                l.symlink("evil", "../outside").file("evil/escaped", "x");
            }),
        ),
        (
            "absolute-symlink-then-write",
            Box::new(|l: &mut Layer| {
                l.symlink("evil", "/etc").file("evil/passwd", "x");
            }),
        ),
        (
            "hardlink-dotdot",
            Box::new(|l: &mut Layer| {
                l.hardlink("stolen", "../outside/secret");
            }),
        ),
        (
            "whiteout-dotdot",
            Box::new(|l: &mut Layer| {
                l.raw("../outside/.wh.secret", tar::EntryType::Regular, None, b"");
            }),
        ),
    ];
    std::fs::write(outside.join("secret"), "s").unwrap();
    for (name, make) in cases {
        let root = t.path().join(format!("root-{name}"));
        std::fs::create_dir(&root).unwrap();
        let mut l = Layer::new();
        make(&mut l);
        let e = apply(&root, &mut Records::new(), &mut l).expect_err(name);
        let msg = e.to_string();
        assert!(
            msg.contains("..") || msg.contains("absolute") || msg.contains("symlink"),
            "{name}: {msg}"
        );
        assert_eq!(
            names(&outside),
            ["secret"],
            "{name}: something landed outside"
        );
    }
    assert!(!Path::new("/tmp/vse-import-absolute-escape").exists());
}

#[test]
fn a_symlink_climbing_above_the_root_is_refused_across_layers() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut rec = Records::new();
    apply(
        &root,
        &mut rec,
        Layer::new().dir("usr/").symlink("usr/up", "../../.."),
    )
    .unwrap();
    let e = apply(&root, &mut rec, Layer::new().file("usr/up/x", "x")).unwrap_err();
    assert!(matches!(e, LayerError::ClimbsAboveRoot { .. }), "{e}");
    // An absolute symlink from a lower layer is followed inside the root (as /var/run → /run).
    apply(
        &root,
        &mut rec,
        Layer::new()
            .dir("run/")
            .dir("var/")
            .symlink("var/run", "/run"),
    )
    .unwrap();
    apply(&root, &mut rec, Layer::new().file("var/run/pid", "1")).unwrap();
    assert_eq!(std::fs::read_to_string(root.join("run/pid")).unwrap(), "1");
}
