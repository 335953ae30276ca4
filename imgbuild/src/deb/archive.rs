//! The `.deb` container: an `ar` archive holding `debian-binary`, `control.tar.*` and
//! `data.tar.*`. Members are decompressed (gz, xz, zst or none) behind a byte limit, so a
//! corrupted or hostile archive gives a clear error instead of filling the disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
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

/// Reads `deb`, hands the decompressed data tarball to `on_data`, returns the control files.
/// `limit` bounds the uncompressed size of the data tarball.
pub fn read_deb<E>(
    deb: &Path,
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
    let file = File::open(deb).map_err(io_err)?;
    let available = file.metadata().map_err(io_err)?.len();
    let mut ar = ar::Archive::new(BufReader::new(file));
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
