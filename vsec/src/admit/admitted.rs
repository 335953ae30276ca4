//! An image read once. Admission and boot must see the same bytes: the manifest is read into
//! memory once (its signature is verified over those bytes and the rules run on their parse),
//! and every part is opened once, by a plain name relative to one descriptor of the image
//! directory, refusing symlinks and anything but regular files. What boots is a copy made
//! from those descriptors into a directory the caller owns, each part hashed while it is
//! copied and the copy published (renamed into place) only when every hash matches the
//! manifest. Whatever the image directory's owner renames or rewrites meanwhile is never
//! booted.

use super::{AdmitError, SIGNATURE, check_signature, problems};
use crate::merge::Stack;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use vse_image::ImageError;
use vse_image::manifest::{MANIFEST, Manifest};

/// Largest manifest read (it lists every package: a few hundred KiB in practice).
pub const MAX_MANIFEST: u64 = 16 << 20;
/// Largest detached signature read.
const MAX_SIGNATURE: u64 = 1 << 20;
/// Copy buffer; an all-zero chunk becomes a hole in the copy (root disks are sparse).
const CHUNK: usize = 1 << 20;

/// Who may read a published copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readers {
    /// The caller only (a user's private cache: directories 0700, files 0400).
    Owner,
    /// Anyone who knows the digest (a root-owned store a QEMU running as the job user boots
    /// from: the store 0711, so it cannot be listed, each copy 0755 with files 0444).
    Anyone,
}

/// An image directory as read once: the manifest's bytes and parse, its signature, and one
/// open descriptor per part.
#[derive(Debug)]
pub struct Admitted {
    dir: PathBuf,
    manifest_bytes: Vec<u8>,
    manifest: Manifest,
    signature: Option<Vec<u8>>,
    parts: BTreeMap<String, File>,
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> AdmitError + '_ {
    move |source| AdmitError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn cstr(p: &[u8]) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(p).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(dir.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated path; the result is checked before use.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `name` (one plain component) in `dir`: never through a symlink, never blocking on a FIFO
/// or device, only a regular file. `Ok(None)`: it does not exist.
fn open_in(dir: &OwnedFd, name: &str) -> std::io::Result<Option<File>> {
    let c = cstr(name.as_bytes())?;
    let flags =
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `dir` is an open directory and `c` a valid NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::NotFound => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(Some(f))
}

fn read_bounded(f: &File, max: u64, path: &Path) -> Result<Vec<u8>, AdmitError> {
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err(path))?;
    if bytes.len() as u64 > max {
        return Err(AdmitError::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(bytes)
}

fn plain_name(file: &str) -> bool {
    let mut c = Path::new(file).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
}

impl Admitted {
    /// Reads `dir`'s manifest and signature and opens every part, with the caller's
    /// privileges (a root service runs this on a thread with the job user's file-system ids).
    pub fn open(dir: &Path) -> Result<Admitted, AdmitError> {
        let dir = std::path::absolute(dir).map_err(read_err(dir))?;
        let dfd = open_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                AdmitError::Image(ImageError::NotAnImage { dir: dir.clone() })
            }
            _ => AdmitError::Read {
                path: dir.clone(),
                source: e,
            },
        })?;
        let mpath = dir.join(MANIFEST);
        let mf = open_in(&dfd, MANIFEST)
            .map_err(read_err(&mpath))?
            .ok_or_else(|| AdmitError::Image(ImageError::NotAnImage { dir: dir.clone() }))?;
        let manifest_bytes = read_bounded(&mf, MAX_MANIFEST, &mpath)?;
        let manifest = vse_image::parse_manifest(&dir, &mpath, &manifest_bytes)?;
        let spath = dir.join(SIGNATURE);
        let signature = match open_in(&dfd, SIGNATURE).map_err(read_err(&spath))? {
            Some(f) => Some(read_bounded(&f, MAX_SIGNATURE, &spath)?),
            None => None,
        };
        let mut parts = BTreeMap::new();
        for (name, p) in &manifest.parts {
            let escapes = || {
                AdmitError::Image(ImageError::Escapes {
                    dir: dir.clone(),
                    part: name.clone(),
                    file: p.file.clone(),
                })
            };
            let incomplete = || {
                AdmitError::Image(ImageError::Incomplete {
                    dir: dir.clone(),
                    part: name.clone(),
                    file: p.file.clone(),
                })
            };
            if !plain_name(&p.file) || p.file == MANIFEST || p.file == SIGNATURE {
                return Err(escapes());
            }
            let f = match open_in(&dfd, &p.file) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(incomplete()),
                Err(_) => return Err(escapes()),
            };
            if f.metadata().map_err(read_err(&dir.join(&p.file)))?.len() != p.size {
                return Err(incomplete());
            }
            parts.insert(name.clone(), f);
        }
        Ok(Admitted {
            dir,
            manifest_bytes,
            manifest,
            signature,
            parts,
        })
    }

    /// The directory it was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest's bytes as read (what a signature covers).
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    /// SHA256 of the manifest's bytes, then the signature's: the name of a published copy.
    /// The manifest records every part's SHA256, so equal manifests mean equal parts; the
    /// signature goes with the copy, so a copy of the same image signed by another key (an
    /// older key, or none) is another copy, never one that stands in for this one.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(&self.manifest_bytes);
        if let Some(sig) = &self.signature {
            h.update(sig);
        }
        hex::encode(h.finalize())
    }

    /// The stack's rules on the manifest's parse, and each `images.signed_by` rule on the
    /// signature over the manifest's bytes. The parts are checked by [`Admitted::publish`]
    /// (or [`Admitted::verify_parts`]).
    pub fn check(&self, st: &Stack) -> Result<(), AdmitError> {
        let problems = problems(&self.dir.display().to_string(), &self.manifest, st);
        if !problems.is_empty() {
            return Err(AdmitError::Refused {
                image: self.dir.clone(),
                problems: problems.sorted(),
            });
        }
        for rule in &st.images.signed_by {
            check_signature(
                &self.dir,
                &self.manifest_bytes,
                self.signature.as_deref(),
                &rule.value,
                &rule.at,
            )?;
        }
        Ok(())
    }

    /// Every part hashes, through its descriptor, to what the manifest says.
    pub fn verify_parts(&self) -> Result<(), AdmitError> {
        for (name, f) in &self.parts {
            self.copy_part(name, f, None)?;
        }
        Ok(())
    }

    /// Hashes part `name` from `f` (from offset 0, whatever else reads it), writing it to
    /// `to` when given; refuses it when the hash is not the manifest's.
    fn copy_part(&self, name: &str, f: &File, mut to: Option<&mut File>) -> Result<(), AdmitError> {
        let part = &self.manifest.parts[name];
        let path = self.dir.join(&part.file);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let n = f.read_at(&mut buf, off).map_err(read_err(&path))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            if let Some(out) = to.as_deref_mut() {
                if buf[..n].iter().all(|b| *b == 0) {
                    out.set_len(off + n as u64).map_err(read_err(&path))?;
                } else {
                    out.write_all_at(&buf[..n], off).map_err(read_err(&path))?;
                }
            }
            off += n as u64;
        }
        let actual = hex::encode(h.finalize());
        if off != part.size || actual != part.sha256 {
            return Err(AdmitError::Tampered {
                image: self.dir.clone(),
                part: name.to_string(),
                expected: part.sha256.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// The image as a directory in `store` (named by [`Admitted::digest`]), copied from the
    /// descriptors and checked while copying; an earlier copy of the same manifest is reused.
    /// `store` must be the caller's own and writable by nobody else.
    pub fn publish(&self, store: &Path, readers: Readers) -> Result<PathBuf, AdmitError> {
        let (store_mode, dir_mode, file_mode) = match readers {
            Readers::Owner => (0o700, 0o700, 0o400),
            Readers::Anyone => (0o711, 0o755, 0o444),
        };
        let store_err = |source| AdmitError::Store {
            dir: store.to_path_buf(),
            source,
        };
        vse_base::private_dir(store, "admitted image store")
            .map_err(|e| store_err(std::io::Error::other(e)))?;
        // Through a descriptor of the checked directory itself, never a path a link could
        // redirect.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(store)
            .and_then(|d| d.set_permissions(std::fs::Permissions::from_mode(store_mode)))
            .map_err(store_err)?;
        let dest = store.join(self.digest());
        if owned_dir(&dest).is_ok() {
            return Ok(dest);
        }
        let tmp = tempfile::Builder::new()
            .prefix(".copy-")
            .tempdir_in(store)
            .map_err(store_err)?;
        let create = |name: &str| {
            let p = tmp.path().join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .map_err(|source| AdmitError::Store {
                    dir: p.clone(),
                    source,
                })
        };
        for (name, f) in &self.parts {
            let mut out = create(&self.manifest.parts[name].file)?;
            self.copy_part(name, f, Some(&mut out))?;
            out.set_permissions(std::fs::Permissions::from_mode(file_mode))
                .map_err(store_err)?;
        }
        let mut small = vec![(MANIFEST, &self.manifest_bytes)];
        if let Some(sig) = &self.signature {
            small.push((SIGNATURE, sig));
        }
        for (name, bytes) in small {
            let mut out = create(name)?;
            out.write_all(bytes).map_err(store_err)?;
            out.set_permissions(std::fs::Permissions::from_mode(file_mode))
                .map_err(store_err)?;
        }
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(dir_mode))
            .map_err(store_err)?;
        let tmp = tmp.keep();
        if let Err(e) = std::fs::rename(&tmp, &dest) {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another launch published the same manifest first: its copy is as good.
            if owned_dir(&dest).is_err() {
                return Err(store_err(e));
            }
        }
        Ok(dest)
    }
}

/// `p` is a real directory (not a symlink) owned by this process's user, which nobody else
/// may write.
fn owned_dir(p: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(p)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} must be a directory owned by uid {me} that no one else can write",
            p.display()
        )));
    }
    Ok(())
}
