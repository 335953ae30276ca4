//! vse-image: the image directory `vse build` writes and everything that boots one reads —
//! `manifest.json` (what the image is, its parts with their sizes and SHA256) and the parts it
//! names. [`ImageDir::open`] is the one way in: it says precisely why a directory is not a
//! bootable image, and hands out absolute paths of the boot parts.

#![forbid(unsafe_code)]

pub mod manifest;

pub use manifest::{InitramfsInfo, MANIFEST, MANIFEST_FORMAT, Manifest, Part};

use std::path::{Component, Path, PathBuf};

/// Why a directory is not a bootable image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "{}: no {MANIFEST}; expected an image directory written by `vse build`",
        dir.display()
    )]
    NotAnImage { dir: PathBuf },
    #[error("{}: cannot read: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: not a valid image manifest: {message}; hint: rebuild the image with `vse build`",
        path.display()
    )]
    Invalid { path: PathBuf, message: String },
    #[error(
        "{}: image format {found} is not supported (this vse reads format {supported}); hint: rebuild the image with this vse",
        dir.display()
    )]
    UnsupportedFormat {
        dir: PathBuf,
        found: u64,
        supported: u32,
    },
    #[error(
        "{}: image part {part} ({file}) is not a regular file inside the image directory; \
         a manifest must not point a VM at a host file or device",
        dir.display()
    )]
    Escapes {
        dir: PathBuf,
        part: String,
        file: String,
    },
    #[error("{}: the image has no {part} part; hint: rebuild it with `vse build`", dir.display())]
    MissingPart { dir: PathBuf, part: &'static str },
    #[error(
        "{}: image is incomplete (part {part}, {file}, is missing or has the wrong size); hint: rebuild it with `vse build`",
        dir.display()
    )]
    Incomplete {
        dir: PathBuf,
        part: String,
        file: String,
    },
}

/// Largest manifest read: a real one is a few KiB (parts, provenance, policies).
pub const MAX_MANIFEST: u64 = 1 << 20;

/// The manifest's text, refused past [`MAX_MANIFEST`] bytes rather than read whole.
pub fn read_manifest(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_MANIFEST + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_MANIFEST {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_MANIFEST} bytes: not a manifest vse wrote"),
        ));
    }
    Ok(text)
}

/// A complete image directory: every part present with its recorded size.
#[derive(Debug, Clone)]
pub struct ImageDir {
    dir: PathBuf,
    manifest: Manifest,
    kernel: PathBuf,
    initrd: PathBuf,
    root: PathBuf,
}

impl ImageDir {
    /// Reads and checks `dir`'s manifest and parts (sizes only: hashing a multi-GiB root disk
    /// on every boot would cost more than the boot).
    pub fn open(dir: &Path) -> Result<ImageDir, ImageError> {
        let dir = std::path::absolute(dir).map_err(|source| ImageError::Unreadable {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(MANIFEST);
        let text = match read_manifest(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::NotAnImage { dir });
            }
            Err(source) => return Err(ImageError::Unreadable { path, source }),
        };
        let manifest = parse(&dir, &path, &text)?;
        for (name, p) in &manifest.parts {
            // A manifest written by someone else must not point the VM at a host file or
            // device: one plain name, a regular file (not a symlink) in the directory.
            let mut c = Path::new(&p.file).components();
            let plain = matches!((c.next(), c.next()), (Some(Component::Normal(_)), None));
            let regular =
                plain && std::fs::symlink_metadata(dir.join(&p.file)).is_ok_and(|m| m.is_file());
            if !regular {
                return Err(ImageError::Escapes {
                    dir,
                    part: name.clone(),
                    file: p.file.clone(),
                });
            }
            let ok = std::fs::metadata(dir.join(&p.file)).is_ok_and(|m| m.len() == p.size);
            if !ok {
                return Err(ImageError::Incomplete {
                    dir,
                    part: name.clone(),
                    file: p.file.clone(),
                });
            }
        }
        let part = |part: &'static str| {
            manifest
                .part_path(&dir, part)
                .ok_or_else(|| ImageError::MissingPart {
                    dir: dir.clone(),
                    part,
                })
        };
        let (kernel, initrd, root) = (part("kernel")?, part("initrd")?, part("root")?);
        Ok(ImageDir {
            dir,
            manifest,
            kernel,
            initrd,
            root,
        })
    }

    /// The directory, as an absolute path.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn kernel(&self) -> &Path {
        &self.kernel
    }

    pub fn initrd(&self) -> &Path {
        &self.initrd
    }

    /// The raw ext4 root disk (VMs boot on copy-on-write overlays of it).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn cmdline(&self) -> &str {
        &self.manifest.kernel_cmdline
    }

    /// Any part by its manifest name (`qcow2`, `tar`, ...), as an absolute path.
    pub fn part(&self, name: &str) -> Option<PathBuf> {
        self.manifest.part_path(&self.dir, name)
    }
}

/// A manifest from bytes already read (`path` names them in errors): a caller that verifies
/// a signature over the bytes parses those same bytes, never a second read of the file.
pub fn parse_manifest(dir: &Path, path: &Path, bytes: &[u8]) -> Result<Manifest, ImageError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ImageError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    parse(dir, path, text)
}

/// The format is checked before the fields, so a newer image says so instead of failing on
/// a field this version does not know.
fn parse(dir: &Path, path: &Path, text: &str) -> Result<Manifest, ImageError> {
    let invalid = |e: serde_json::Error| ImageError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
    match v.get("format").and_then(serde_json::Value::as_u64) {
        Some(f) if f == u64::from(MANIFEST_FORMAT) => {}
        Some(found) => {
            return Err(ImageError::UnsupportedFormat {
                dir: dir.to_path_buf(),
                found,
                supported: MANIFEST_FORMAT,
            });
        }
        None => {
            return Err(ImageError::Invalid {
                path: path.to_path_buf(),
                message: "no numeric `format` field".into(),
            });
        }
    }
    serde_json::from_value(v).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn manifest(parts: &[(&str, &str, u64)]) -> Manifest {
        let parts = parts
            .iter()
            .map(|(n, f, size)| {
                let (file, size) = (f.to_string(), *size);
                let sha256 = String::new();
                (n.to_string(), Part { file, size, sha256 })
            })
            .collect::<BTreeMap<_, _>>();
        Manifest::assembled("test", "console=ttyS0 root=LABEL=vse", parts)
    }

    fn image(parts: &[(&str, &str, u64)], files: &[(&str, usize)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (f, len) in files {
            std::fs::write(d.path().join(f), vec![0u8; *len]).unwrap();
        }
        let m = serde_json::to_string(&manifest(parts)).unwrap();
        std::fs::write(d.path().join(MANIFEST), m).unwrap();
        d
    }

    #[test]
    fn an_oversized_manifest_is_refused_unread() {
        let d = image(&BOOT, &[]);
        let mut m = serde_json::to_string(&manifest(&BOOT)).unwrap();
        m.push_str(&" ".repeat(MAX_MANIFEST as usize));
        std::fs::write(d.path().join(MANIFEST), m).unwrap();
        let e = ImageDir::open(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("cannot read") && e.contains("larger than"),
            "{e}"
        );
        assert!(Manifest::read(d.path()).is_none());
    }

    const BOOT: [(&str, &str, u64); 3] = [
        ("kernel", "vmlinuz", 3),
        ("initrd", "initrd.img", 2),
        ("root", "root.raw", 5),
    ];

    #[test]
    fn opens_a_complete_image_with_absolute_part_paths() {
        let d = image(&BOOT, &[("vmlinuz", 3), ("initrd.img", 2), ("root.raw", 5)]);
        let img = ImageDir::open(d.path()).unwrap();
        assert_eq!(img.kernel(), d.path().join("vmlinuz"));
        assert_eq!(img.initrd(), d.path().join("initrd.img"));
        assert_eq!(img.root(), d.path().join("root.raw"));
        assert!(img.root().is_absolute());
        assert_eq!(img.cmdline(), "console=ttyS0 root=LABEL=vse");
        assert_eq!(img.part("qcow2"), None);
    }

    #[test]
    fn says_why_a_directory_is_not_an_image() {
        let empty = tempfile::tempdir().unwrap();
        let e = ImageDir::open(empty.path()).unwrap_err();
        assert!(matches!(e, ImageError::NotAnImage { .. }), "{e}");
        assert!(e.to_string().contains("manifest.json"), "{e}");

        let short = image(&BOOT, &[("vmlinuz", 3), ("initrd.img", 2), ("root.raw", 4)]);
        match ImageDir::open(short.path()).unwrap_err() {
            ImageError::Incomplete { part, file, .. } => {
                assert_eq!((part.as_str(), file.as_str()), ("root", "root.raw"))
            }
            e => panic!("{e}"),
        }

        let no_root = image(&BOOT[..2], &[("vmlinuz", 3), ("initrd.img", 2)]);
        let e = ImageDir::open(no_root.path()).unwrap_err();
        assert!(
            matches!(e, ImageError::MissingPart { part: "root", .. }),
            "{e}"
        );

        let bad = tempfile::tempdir().unwrap();
        std::fs::write(bad.path().join(MANIFEST), "{not json").unwrap();
        let e = ImageDir::open(bad.path()).unwrap_err();
        assert!(matches!(e, ImageError::Invalid { .. }), "{e}");

        std::fs::write(bad.path().join(MANIFEST), r#"{"format": 9}"#).unwrap();
        let e = ImageDir::open(bad.path()).unwrap_err();
        assert!(
            matches!(e, ImageError::UnsupportedFormat { found: 9, .. }),
            "{e}"
        );
    }
}
