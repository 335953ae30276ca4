//! The `.deb` container: an `ar` archive holding `debian-binary`, `control.tar.*` and
//! `data.tar.*`. Members are decompressed (gz, xz, zst or none) behind a byte limit, so a
//! corrupted or hostile archive gives a clear error instead of filling the disk.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Largest control tarball accepted (uncompressed); real ones are a few KiB.
const CONTROL_LIMIT: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DebError {
    #[error("{deb}: cannot read: {source}")]
    Io { deb: PathBuf, source: io::Error },
    #[error("{deb}: not a Debian package: {reason}")]
    Format { deb: PathBuf, reason: String },
    #[error(
        "{deb}: member {member} declares {declared} bytes but the file has only {available}; truncated or hostile archive"
    )]
    MemberTooLarge {
        deb: PathBuf,
        member: String,
        declared: u64,
        available: u64,
    },
    #[error("{deb}: member {member} is corrupt: {source}")]
    Corrupt {
        deb: PathBuf,
        member: String,
        source: io::Error,
    },
    #[error(
        "{deb}: the bytes read are not the verified package ({got_size} bytes with SHA256 {got_sha256}, expected {size} bytes with SHA256 {sha256}); it changed after it was verified, nothing of it is used"
    )]
    Changed {
        deb: PathBuf,
        size: u64,
        sha256: String,
        got_size: u64,
        got_sha256: String,
    },
    #[error(
        "{deb}: member {member} unpacks to more than {limit} bytes; refusing (raise the limit if the package is genuinely this large)"
    )]
    Oversized {
        deb: PathBuf,
        member: String,
        limit: u64,
    },
}

/// Files of the control tarball, by name (`control`, `postinst`, `md5sums`, ...).
#[derive(Debug, Clone, Default)]
pub struct ControlFiles {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl ControlFiles {
    pub fn control_text(&self) -> &str {
        self.files
            .get("control")
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    /// The value of a (single-line) control field.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.control_text().lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (!l.starts_with([' ', '\t']) && k.eq_ignore_ascii_case(name)).then(|| v.trim())
        })
    }
}

/// A `.deb` on disk and what it must be: the size and SHA256 a verified index lists.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DebFile {
    pub path: PathBuf,
    pub size: u64,
    /// Hex, either case.
    pub sha256: String,
}

impl DebFile {
    /// `path` with the size and SHA256 of its bytes now, for a file the caller made itself.
    pub fn hashed(path: PathBuf) -> io::Result<DebFile> {
        let (size, sha256) = crate::fetch::hash_file(&path)?;
        Ok(DebFile { path, size, sha256 })
    }
}

/// Hashes every byte read through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    len: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// Reads `deb`, hands the decompressed data tarball to `on_data`, returns the control files.
/// `limit` bounds the uncompressed size of the data tarball.
///
/// The file is opened once (never through a symlink) and every byte parsed is hashed on the
/// way: when the whole file is not the size and SHA256 of `deb`, the result is an error, so
/// a file changed in a cache after it was verified is never used (the caller discards what
/// `on_data` made of it).
pub fn read_deb<E>(
    deb: &DebFile,
    limit: u64,
    on_data: impl FnMut(&mut dyn Read) -> Result<(), E>,
) -> Result<ControlFiles, E>
where
    E: From<DebError>,
{
    let path = deb.path.as_path();
    let io_err = |source| DebError::Io {
        deb: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err)?;
    let mut hashing = Hashing {
        inner: file,
        hash: Sha256::new(),
        len: 0,
    };
    let control = read_members(path, &mut hashing, limit, on_data);
    // A file that is not the verified one says so, whatever its parse made of it.
    let rest = io::copy(&mut hashing, &mut io::sink());
    let got_sha256 = hex::encode(hashing.hash.finalize());
    if hashing.len != deb.size || !got_sha256.eq_ignore_ascii_case(&deb.sha256) {
        return Err(DebError::Changed {
            deb: path.to_path_buf(),
            size: deb.size,
            sha256: deb.sha256.clone(),
            got_size: hashing.len,
            got_sha256,
        }
        .into());
    }
    let control = control?;
    rest.map_err(io_err)?;
    Ok(control)
}

fn read_members<E>(
    deb: &Path,
    hashing: &mut Hashing<File>,
    limit: u64,
    mut on_data: impl FnMut(&mut dyn Read) -> Result<(), E>,
) -> Result<ControlFiles, E>
where
    E: From<DebError>,
{
    let io_err = |source| DebError::Io {
        deb: deb.to_path_buf(),
        source,
    };
    let available = hashing.inner.metadata().map_err(io_err)?.len();
    let mut ar = ar::Archive::new(BufReader::new(hashing));
    let mut seen_binary = false;
    let mut control = None;
    let mut seen_data = false;
    while let Some(entry) = ar.next_entry() {
        let mut entry = entry.map_err(|e| DebError::Format {
            deb: deb.to_path_buf(),
            reason: format!("bad ar archive: {e}"),
        })?;
        let member = String::from_utf8_lossy(entry.header().identifier()).into_owned();
        let declared = entry.header().size();
        if declared > available {
            return Err(DebError::MemberTooLarge {
                deb: deb.to_path_buf(),
                member,
                declared,
                available,
            }
            .into());
        }
        if member == "debian-binary" {
            let mut v = String::new();
            entry
                .by_ref()
                .take(16)
                .read_to_string(&mut v)
                .map_err(io_err)?;
            if !v.starts_with("2.") {
                return Err(DebError::Format {
                    deb: deb.to_path_buf(),
                    reason: format!("unsupported format version {:?} (expected 2.x)", v.trim()),
                }
                .into());
            }
            seen_binary = true;
        } else if let Some(comp) = member.strip_prefix("control.tar") {
            let mut r = decoder(deb, &member, comp, &mut entry, CONTROL_LIMIT)?;
            control = Some(read_control(deb, &member, &mut r)?);
        } else if let Some(comp) = member.strip_prefix("data.tar") {
            if !seen_binary || control.is_none() {
                return Err(DebError::Format {
                    deb: deb.to_path_buf(),
                    reason: "data.tar comes before debian-binary/control.tar".into(),
                }
                .into());
            }
            let mut r = decoder(deb, &member, comp, &mut entry, limit)?;
            on_data(&mut r)?;
            seen_data = true;
        }
    }
    match (seen_binary, control, seen_data) {
        (true, Some(c), true) => Ok(c),
        _ => Err(DebError::Format {
            deb: deb.to_path_buf(),
            reason: "missing debian-binary, control.tar.* or data.tar.* member".into(),
        }
        .into()),
    }
}

fn decoder<'a>(
    deb: &Path,
    member: &str,
    comp: &str,
    raw: &'a mut dyn Read,
    limit: u64,
) -> Result<LimitedReader<Box<dyn Read + 'a>>, DebError> {
    let inner: Box<dyn Read + 'a> =
        match comp {
            "" => Box::new(raw),
            ".gz" => Box::new(flate2::read::GzDecoder::new(raw)),
            ".xz" => Box::new(xz2::read::XzDecoder::new(raw)),
            ".zst" => Box::new(zstd::stream::read::Decoder::new(raw).map_err(|source| {
                DebError::Corrupt {
                    deb: deb.to_path_buf(),
                    member: member.into(),
                    source,
                }
            })?),
            other => {
                return Err(DebError::Format {
                    deb: deb.to_path_buf(),
                    reason: format!(
                        "member {member}: unknown compression {other:?} (expected .gz, .xz or .zst)"
                    ),
                });
            }
        };
    Ok(LimitedReader {
        inner,
        left: limit,
        limit,
    })
}

fn read_control(deb: &Path, member: &str, r: &mut dyn Read) -> Result<ControlFiles, DebError> {
    let corrupt = |source| DebError::Corrupt {
        deb: deb.to_path_buf(),
        member: member.into(),
        source,
    };
    let mut files = BTreeMap::new();
    let mut tar = tar::Archive::new(r);
    for entry in tar.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&path)
            .trim_start_matches("./")
            .to_string();
        if name.contains('/') || name.is_empty() {
            continue; // control files live at the top level; anything else is ignored
        }
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(corrupt)?;
        files.insert(name, data);
    }
    if !files.contains_key("control") {
        return Err(DebError::Format {
            deb: deb.to_path_buf(),
            reason: format!("{member} has no control file"),
        });
    }
    Ok(ControlFiles { files })
}

/// Fails with `ErrorKind::FileTooLarge` once more than `limit` bytes have been read.
pub struct LimitedReader<R> {
    inner: R,
    left: u64,
    pub limit: u64,
}

impl<R> LimitedReader<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        LimitedReader {
            inner,
            left: limit,
            limit,
        }
    }
}

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("unpacked size exceeds the limit of {} bytes", self.limit),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Maps an I/O error raised while reading a member to the right [`DebError`].
pub fn member_error(deb: &Path, member: &str, limit: u64, source: io::Error) -> DebError {
    if source.kind() == io::ErrorKind::FileTooLarge {
        DebError::Oversized {
            deb: deb.to_path_buf(),
            member: member.into(),
            limit,
        }
    } else {
        DebError::Corrupt {
            deb: deb.to_path_buf(),
            member: member.into(),
            source,
        }
    }
}
