//! Reading an untrusted image source: files of a directory or members of a tar archive (found
//! by an index of their offsets, never unpacked to disk), with SHA-256 verification. Every
//! piece of JSON is read behind a size limit and checked against its digest before parsing.

use super::ImportError;
use crate::deb::RelPath;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Largest JSON document (index, manifest, config) accepted.
pub const JSON_LIMIT: u64 = 4 << 20;
/// Symlinks followed inside an archive to find one member (Docker's `<id>/layer.tar`).
const MAX_MEMBER_HOPS: usize = 8;

/// A `sha256:<hex>` digest; other algorithms are refused rather than skipped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest, String> {
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            format!("digest {s:?} is not sha256:<hex> (only SHA-256 digests are supported)")
        })?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(format!("digest {s:?} is not 64 lowercase hex digits"));
        }
        Ok(Digest(hex.to_string()))
    }

    pub fn of_hasher(h: Sha256) -> Digest {
        Digest(hex::encode(h.finalize()))
    }

    pub fn hex(&self) -> &str {
        &self.0
    }

    /// Where an OCI layout keeps this blob.
    pub fn blob_path(&self) -> String {
        format!("blobs/sha256/{}", self.0)
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

/// Hashes and counts what passes through.
pub struct HashReader<R> {
    pub inner: R,
    pub hasher: Sha256,
    pub count: u64,
}

impl<R: Read> HashReader<R> {
    pub fn new(inner: R) -> Self {
        HashReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads to the end, then returns the digest and byte count.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest::of_hasher(self.hasher), self.count))
    }
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[derive(Debug, Clone)]
pub struct Member {
    offset: u64,
    size: u64,
    link: Option<String>,
}

/// Where the source's files are.
#[derive(Debug)]
pub enum Store {
    /// A directory (an OCI layout, or the directory of a rootfs tarball).
    Dir(PathBuf),
    /// A tar archive, indexed once.
    Tar {
        file: PathBuf,
        members: BTreeMap<String, Member>,
    },
}

impl Store {
    /// Indexes the members of an uncompressed tar archive.
    pub fn tar(file: &Path) -> Result<Store, ImportError> {
        let bad = |reason: String| ImportError::Source {
            what: file.display().to_string(),
            reason,
        };
        let f = File::open(file).map_err(|e| ImportError::io(file, e))?;
        let mut ar = tar::Archive::new(f);
        let mut members = BTreeMap::new();
        let entries = ar
            .entries_with_seek()
            .map_err(|e| bad(format!("not a tar archive: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| bad(format!("not a readable tar archive: {e}")))?;
            let ty = entry.header().entry_type();
            let Ok(name) = RelPath::parse(&entry.path_bytes()) else {
                continue; // never looked up: only well-formed names are asked for
            };
            let link = match ty {
                tar::EntryType::Symlink => Some(
                    String::from_utf8_lossy(&entry.link_name_bytes().unwrap_or_default())
                        .into_owned(),
                ),
                tar::EntryType::Regular | tar::EntryType::Continuous => None,
                _ => continue,
            };
            members.insert(
                name.as_str().to_string(),
                Member {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                    link,
                },
            );
        }
        if members.is_empty() {
            return Err(bad(
                "not a tar archive (no members); hint: a compressed archive must be decompressed first".into(),
            ));
        }
        Ok(Store::Tar {
            file: file.to_path_buf(),
            members,
        })
    }

    fn describe(&self, name: &str) -> String {
        match self {
            Store::Dir(d) => d.join(name).display().to_string(),
            Store::Tar { file, .. } => format!("{}:{name}", file.display()),
        }
    }

    fn missing(&self, name: &str) -> ImportError {
        ImportError::Missing {
            what: self.describe(name),
        }
    }

    /// Opens a file or member; returns it with its size.
    pub fn open(&self, name: &str) -> Result<(Box<dyn Read>, u64), ImportError> {
        let rel = RelPath::parse(name.as_bytes()).map_err(|_| self.missing(name))?;
        match self {
            Store::Dir(dir) => {
                let path = dir.join(rel.as_str());
                match std::fs::symlink_metadata(&path) {
                    Ok(md) if md.is_file() => {}
                    Ok(_) => {
                        return Err(ImportError::Source {
                            what: path.display().to_string(),
                            reason: "not a regular file".into(),
                        });
                    }
                    Err(_) => return Err(self.missing(name)),
                }
                let f = File::open(&path).map_err(|e| ImportError::io(&path, e))?;
                let size = f.metadata().map_err(|e| ImportError::io(&path, e))?.len();
                Ok((Box::new(f), size))
            }
            Store::Tar { file, members } => {
                let mut key = rel.as_str().to_string();
                for _ in 0..MAX_MEMBER_HOPS {
                    let m = members.get(&key).ok_or_else(|| self.missing(name))?;
                    let Some(link) = &m.link else {
                        let mut f = File::open(file).map_err(|e| ImportError::io(file, e))?;
                        f.seek(SeekFrom::Start(m.offset))
                            .map_err(|e| ImportError::io(file, e))?;
                        return Ok((Box::new(f.take(m.size)), m.size));
                    };
                    key = member_link(&key, link).ok_or_else(|| self.missing(name))?;
                }
                Err(self.missing(name))
            }
        }
    }

    pub fn exists(&self, name: &str) -> bool {
        match self {
            Store::Dir(dir) => dir.join(name).is_file(),
            Store::Tar { members, .. } => members.contains_key(name),
        }
    }

    /// A small file (JSON), at most [`JSON_LIMIT`] bytes.
    pub fn read_small(&self, name: &str) -> Result<Vec<u8>, ImportError> {
        let (r, size) = self.open(name)?;
        if size > JSON_LIMIT {
            return Err(ImportError::Source {
                what: self.describe(name),
                reason: format!("{size} bytes is more than the {JSON_LIMIT} accepted for metadata"),
            });
        }
        let mut buf = Vec::with_capacity(size as usize);
        r.take(JSON_LIMIT)
            .read_to_end(&mut buf)
            .map_err(|e| ImportError::io(Path::new(&self.describe(name)), e))?;
        Ok(buf)
    }

    /// A small file whose SHA-256 must be `digest` (and its size `size`, when known).
    pub fn read_verified(
        &self,
        name: &str,
        digest: &Digest,
        size: Option<u64>,
    ) -> Result<Vec<u8>, ImportError> {
        let data = self.read_small(name)?;
        let mut h = Sha256::new();
        h.update(&data);
        self.check(name, digest, size, &Digest::of_hasher(h), data.len() as u64)?;
        Ok(data)
    }

    /// Streams a (large) file through SHA-256 and checks it against `digest` and `size`.
    pub fn verify(
        &self,
        name: &str,
        digest: &Digest,
        size: Option<u64>,
    ) -> Result<(), ImportError> {
        let (r, _) = self.open(name)?;
        let (got, n) = HashReader::new(r)
            .finish()
            .map_err(|e| ImportError::io(Path::new(&self.describe(name)), e))?;
        self.check(name, digest, size, &got, n)
    }

    fn check(
        &self,
        name: &str,
        want: &Digest,
        size: Option<u64>,
        got: &Digest,
        n: u64,
    ) -> Result<(), ImportError> {
        if let Some(s) = size
            && s != n
        {
            return Err(ImportError::DigestMismatch {
                what: self.describe(name),
                expected: format!("{s} bytes"),
                found: format!("{n} bytes"),
            });
        }
        if want != got {
            return Err(ImportError::DigestMismatch {
                what: self.describe(name),
                expected: want.to_string(),
                found: got.to_string(),
            });
        }
        Ok(())
    }
}

/// The member a symlink member points to, resolved lexically inside the archive.
fn member_link(from: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        from.split('/').collect()
    };
    if !target.starts_with('/') {
        parts.pop();
    }
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly() {
        let h = "a".repeat(64);
        assert_eq!(Digest::parse(&format!("sha256:{h}")).unwrap().hex(), h);
        assert!(Digest::parse(&format!("sha512:{h}")).is_err());
        assert!(Digest::parse("sha256:abc").is_err());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
    }

    #[test]
    fn member_links_stay_inside_the_archive() {
        assert_eq!(
            member_link("id/layer.tar", "../x.tar").as_deref(),
            Some("x.tar")
        );
        assert_eq!(member_link("a/b", "c").as_deref(), Some("a/c"));
        assert_eq!(member_link("a/b", "../../x"), None);
    }
}
