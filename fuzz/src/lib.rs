//! Helpers shared by the fuzz targets: building the containers (tar, ar, compressed streams)
//! that a fuzzer cannot easily assemble byte by byte, from structured input. Only test-data
//! construction lives here; every parser exercised is the project's own.

use arbitrary::Arbitrary;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One tar member, hostile fields allowed (the name and link target are written into the
/// header as raw bytes, bypassing the `tar` crate's own path checks).
#[derive(Debug, Arbitrary)]
pub struct TarEntry {
    pub name: TarName,
    pub kind: u8,
    pub mode: u16,
    pub link: TarName,
    pub data: Vec<u8>,
    pub uid: u8,
}

/// Names from a small vocabulary (so that entries meet each other: a symlink, then a file
/// through it) or raw bytes.
#[derive(Debug, Arbitrary)]
pub enum TarName {
    Parts(Vec<u8>),
    Raw(Vec<u8>),
}

const WORDS: &[&str] = &[
    ".",
    "..",
    "",
    "a",
    "b",
    "usr",
    "bin",
    "etc",
    "lib",
    "x",
    ".wh.a",
    ".wh.b",
    ".wh..wh..opq",
    "/",
    "//",
    "tmp",
    "..a",
    "a.",
    "dev",
    "var",
    "lib64",
    ".wh.",
    "passwd",
    "boot",
    "index.json",
    "oci-layout",
    "blobs",
    "sha256",
    "manifest.json",
    "repositories",
    "layer.tar",
];

impl TarName {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            TarName::Raw(b) => b.clone(),
            TarName::Parts(p) => {
                let mut out = Vec::new();
                for (i, w) in p.iter().enumerate() {
                    if i > 0 {
                        out.push(b'/');
                    }
                    out.extend_from_slice(WORDS[*w as usize % WORDS.len()].as_bytes());
                }
                out
            }
        }
    }
}

fn entry_type(k: u8) -> tar::EntryType {
    match k % 12 {
        0..=3 => tar::EntryType::Regular,
        4 | 5 => tar::EntryType::Directory,
        6 | 7 => tar::EntryType::Symlink,
        8 => tar::EntryType::Link,
        9 => tar::EntryType::Char,
        10 => tar::EntryType::Fifo,
        _ => tar::EntryType::new(k),
    }
}

/// A tar archive of `entries` (GNU headers; long names go through the GNU long-name member,
/// as real archives do).
pub fn build_tar(entries: &[TarEntry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let name = e.name.bytes();
        let link = e.link.bytes();
        let ty = entry_type(e.kind);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(u32::from(e.mode) & 0o7777);
        h.set_uid(u64::from(e.uid));
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        let data: &[u8] = if ty.is_file() { &e.data } else { &[] };
        h.set_size(data.len() as u64);
        if name.len() > 100 {
            let mut l = tar::Header::new_gnu();
            l.set_entry_type(tar::EntryType::GNULongName);
            l.set_size(name.len() as u64 + 1);
            l.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
            l.set_cksum();
            let mut n = name.clone();
            n.push(0);
            let _ = b.append(&l, n.as_slice());
        }
        {
            let g = h.as_gnu_mut().expect("gnu");
            let n = name.len().min(100);
            g.name[..n].copy_from_slice(&name[..n]);
            let n = link.len().min(100);
            g.linkname[..n].copy_from_slice(&link[..n]);
        }
        h.set_cksum();
        let _ = b.append(&h, data);
    }
    b.into_inner().unwrap_or_default()
}

/// `data` compressed as a `.deb` member or an image layer may be: 0 none, 1 gzip, 2 xz, 3 zstd.
pub fn compress(kind: u8, data: &[u8]) -> Vec<u8> {
    match kind % 4 {
        1 => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = e.write_all(data);
            e.finish().unwrap_or_default()
        }
        2 => {
            let mut e = xz2::write::XzEncoder::new(Vec::new(), 0);
            let _ = e.write_all(data);
            e.finish().unwrap_or_default()
        }
        3 => zstd::stream::encode_all(data, 1).unwrap_or_default(),
        _ => data.to_vec(),
    }
}

/// The member-name suffix of a compression kind as [`compress`] numbers them.
pub fn deb_suffix(kind: u8) -> &'static str {
    match kind % 4 {
        1 => ".gz",
        2 => ".xz",
        3 => ".zst",
        _ => "",
    }
}

/// An `ar` archive of `(name, bytes)` members.
pub fn build_ar(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = ar::Builder::new(Vec::new());
    for (name, data) in members {
        let h = ar::Header::new(name.as_bytes().to_vec(), data.len() as u64);
        let _ = b.append(&h, data.as_slice());
    }
    b.into_inner().unwrap_or_default()
}

/// Every path under `dir` (not following symlinks), `dir` itself excluded.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// A scratch area for a target that writes files: `root` is where writing is allowed, nested
/// a few levels down so that an escape by `..` lands inside the scratch area and is seen, next
/// to a canary directory that nothing may touch.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub canary: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("vse-fuzz-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().join("a/b/c/root");
        std::fs::create_dir_all(&root).expect("root");
        let canary = dir.path().join("a/b/c/canary");
        std::fs::create_dir_all(&canary).expect("canary");
        std::fs::write(canary.join("file"), b"canary").expect("canary file");
        Scratch { dir, root, canary }
    }

    /// Panics when anything outside `root` (and the files in `allowed`) was created, or the
    /// canary changed.
    pub fn check_confined(&self, allowed: &[PathBuf]) {
        let base = self.dir.path();
        let fixed: Vec<PathBuf> = [
            "a",
            "a/b",
            "a/b/c",
            "a/b/c/root",
            "a/b/c/canary",
            "a/b/c/canary/file",
        ]
        .iter()
        .map(|p| base.join(p))
        .collect();
        for p in walk(base) {
            if fixed.contains(&p) || allowed.contains(&p) || p.starts_with(&self.root) {
                continue;
            }
            panic!("created outside the extraction root: {}", p.display());
        }
        let c = std::fs::read(self.canary.join("file")).unwrap_or_default();
        assert_eq!(c, b"canary", "the canary outside the root was changed");
        let meta = std::fs::symlink_metadata(&self.canary).expect("canary dir");
        assert!(meta.is_dir(), "the canary directory was replaced");
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes to a socket whose peer went away must fail with EPIPE, not kill the fuzzer (a
/// libFuzzer binary has no Rust `main` to ignore SIGPIPE).
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
