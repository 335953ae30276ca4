//! The cache file: a fixed header, then an rkyv body (every package record, then the
//! tables). Written to a temporary file and renamed into place; opened by mapping it.
//!
//! Header (little-endian, [`HEADER_LEN`] bytes, the body starts after it so that it is
//! aligned for rkyv): magic, format version, an endianness probe, the key the file was built
//! for, body length, where the tables start, the tables' xxh3 and the header's own xxh3.
//! Package records carry their own xxh3 in the tables and are checked when first touched.

use super::record::{Loc, NameIds, PkgRecord, Tables};
use crate::solve::universe::Universe;
use rkyv::rancor;
use rkyv::util::AlignedVec;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 8] = b"VSEINDEX";
/// Bump on any change to the records, the tables, the header, or to how indices are parsed
/// into packages: a file of another format is rebuilt, never read.
pub const FORMAT: u32 = 1;
const ENDIAN_PROBE: u32 = 0x0102_0304;
pub(super) const HEADER_LEN: usize = 128;

/// Why a cache file was not used (the caller rebuilds it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheFileError {
    #[error("no cache file yet")]
    Missing,
    #[error("cannot read the cache file: {0}")]
    Io(String),
    #[error("not a vse index cache (bad magic)")]
    Magic,
    #[error("written by another vse (cache format {found}, this vse writes {FORMAT})")]
    Format { found: u32 },
    #[error("written on a machine of other byte order")]
    Endian,
    #[error("header checksum mismatch (damaged file)")]
    Header,
    #[error("built for other repositories or another architecture (key mismatch)")]
    Key,
    #[error("built for architecture {found}, not {want}")]
    Arch { found: String, want: String },
    #[error("truncated: {found} bytes where the header promises {want}")]
    Truncated { found: u64, want: u64 },
    #[error("checksum mismatch in the {0} (damaged file)")]
    Checksum(&'static str),
    #[error("invalid archive: {0}")]
    Invalid(String),
}

pub(super) fn xxh3(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

struct Header {
    format: u32,
    endian: u32,
    key: [u8; 32],
    body_len: u64,
    tables_start: u64,
    tables_hash: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&self.format.to_le_bytes());
        h[12..16].copy_from_slice(&self.endian.to_ne_bytes());
        h[16..48].copy_from_slice(&self.key);
        h[48..56].copy_from_slice(&self.body_len.to_le_bytes());
        h[56..64].copy_from_slice(&self.tables_start.to_le_bytes());
        h[64..72].copy_from_slice(&self.tables_hash.to_le_bytes());
        let own = xxh3(&h[0..72]);
        h[72..80].copy_from_slice(&own.to_le_bytes());
        h
    }

    fn decode(h: &[u8]) -> Result<Header, CacheFileError> {
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
        if h.len() < HEADER_LEN {
            return Err(CacheFileError::Truncated {
                found: h.len() as u64,
                want: HEADER_LEN as u64,
            });
        }
        if &h[0..8] != MAGIC {
            return Err(CacheFileError::Magic);
        }
        // The version is read before the checksum: a future vse may change everything after.
        let format = u32_at(8);
        if format != FORMAT {
            return Err(CacheFileError::Format { found: format });
        }
        if xxh3(&h[0..72]) != u64_at(72) {
            return Err(CacheFileError::Header);
        }
        let endian = u32::from_ne_bytes(h[12..16].try_into().expect("4 bytes"));
        if endian != ENDIAN_PROBE {
            return Err(CacheFileError::Endian);
        }
        Ok(Header {
            format,
            endian,
            key: h[16..48].try_into().expect("32 bytes"),
            body_len: u64_at(48),
            tables_start: u64_at(56),
            tables_hash: u64_at(64),
        })
    }
}

/// Serialises the records of `pkgs` into one buffer; their locations are relative to it.
fn records(pkgs: &[crate::index::Package]) -> Result<(AlignedVec, Vec<Loc>), rancor::Error> {
    // Sized up front: growing a buffer of tens of MB by doubling copies it again and again.
    let mut w = AlignedVec::<16>::with_capacity(pkgs.len() * 768);
    let mut locs = Vec::with_capacity(pkgs.len());
    for p in pkgs {
        let start = w.len();
        w = rkyv::api::high::to_bytes_in::<_, rancor::Error>(&PkgRecord::of(p), w)?;
        let end = w.len();
        let pos = rkyv::api::root_position::<super::record::ArchivedPkgRecord>(end);
        locs.push(Loc {
            pos: pos as u64,
            start: start as u64,
            end: end as u64,
            hash: xxh3(&w[start..end]),
        });
    }
    Ok((w, locs))
}

/// A name table sorted by name.
fn name_table(m: &crate::solve::universe::NameMap) -> Vec<NameIds<'_>> {
    let mut v: Vec<NameIds<'_>> = m
        .iter()
        .map(|(name, ids)| NameIds {
            name: name.as_str(),
            ids: ids.as_slice(),
        })
        .collect();
    v.sort_unstable_by_key(|e| e.name);
    v
}

fn align16(n: u64) -> u64 {
    n.div_ceil(16) * 16
}

/// Writes the cache file for `u` at `path` (temporary file + rename: a reader sees the old
/// file or the whole new one; a crash mid-write leaves only a temporary file behind).
///
/// The body is record chunks serialised on several threads, then the tables. rkyv pointers
/// are relative, so a chunk serialised on its own stays valid wherever it lands, as long as
/// it lands 16-aligned; the tables point into no record.
pub fn write(path: &Path, key: &[u8; 32], u: &Universe, arch: &str) -> std::io::Result<()> {
    let pkgs = u.packages();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let per = pkgs.len().div_ceil(threads).max(1);
    let chunks: Vec<(AlignedVec, Vec<Loc>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = pkgs.chunks(per).map(|c| sc.spawn(|| records(c))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<_, _>>()
    })
    .map_err(std::io::Error::other)?;
    let mut locs = Vec::with_capacity(pkgs.len());
    let mut base = 0u64;
    for (buf, l) in &chunks {
        locs.extend(l.iter().map(|l| Loc {
            pos: l.pos + base,
            start: l.start + base,
            end: l.end + base,
            hash: l.hash,
        }));
        base = align16(base + buf.len() as u64);
    }
    let (by_name, providers) = u.maps();
    let tables = Tables {
        arch: arch.to_string(),
        packages: locs,
        by_name: name_table(by_name),
        providers: name_table(providers),
        base: pkgs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.essential || p.priority <= crate::index::Priority::Standard)
            .map(|(i, _)| i as u32)
            .collect(),
    };
    let tables = rkyv::to_bytes::<rancor::Error>(&tables).map_err(std::io::Error::other)?;
    let header = Header {
        format: FORMAT,
        endian: ENDIAN_PROBE,
        key: *key,
        body_len: base + tables.len() as u64,
        tables_start: base,
        tables_hash: xxh3(&tables),
    };
    let dir = path.parent().expect("cache files live in a directory");
    let tmp = tempfile::Builder::new()
        .prefix(".index-")
        .tempfile_in(dir)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp);
    out.write_all(&header.encode())?;
    for (buf, _) in &chunks {
        out.write_all(buf)?;
        let pad = align16(buf.len() as u64) - buf.len() as u64;
        out.write_all(&[0u8; 16][..pad as usize])?;
    }
    out.write_all(&tables)?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A mapped, checked cache file: the header and the tables are verified, package records
/// are verified one by one when first used.
pub(super) struct Mapped {
    map: memmap2::Mmap,
    file: std::fs::File,
    pub tables_start: usize,
}

impl Mapped {
    pub fn open(path: &Path, key: &[u8; 32], arch: &str) -> Result<Mapped, CacheFileError> {
        if cfg!(target_endian = "big") {
            // Package ids are read in place as native integers.
            return Err(CacheFileError::Endian);
        }
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CacheFileError::Missing,
            _ => CacheFileError::Io(e.to_string()),
        })?;
        let len = file
            .metadata()
            .map_err(|e| CacheFileError::Io(e.to_string()))?
            .len();
        if len < HEADER_LEN as u64 {
            return Err(CacheFileError::Truncated {
                found: len,
                want: HEADER_LEN as u64,
            });
        }
        // SAFETY: cache files are created owner-only in an owner-only directory and are
        // replaced only by rename, never written in place, so the mapped bytes do not change
        // under us; every byte read through the map is checked (checksums, bytecheck) first.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CacheFileError::Io(e.to_string()))?;
        // Only the tables are read through the map, and all of them: read ahead.
        let _ = map.advise(memmap2::Advice::WillNeed);
        let h = Header::decode(&map[..HEADER_LEN])?;
        debug_assert_eq!((h.format, h.endian), (FORMAT, ENDIAN_PROBE));
        if &h.key != key {
            return Err(CacheFileError::Key);
        }
        let want = HEADER_LEN as u64 + h.body_len;
        if len != want {
            return Err(CacheFileError::Truncated { found: len, want });
        }
        if h.tables_start > h.body_len {
            return Err(CacheFileError::Invalid("tables outside the body".into()));
        }
        let m = Mapped {
            map,
            file,
            tables_start: h.tables_start as usize,
        };
        if xxh3(&m.body()[m.tables_start..]) != h.tables_hash {
            return Err(CacheFileError::Checksum("tables"));
        }
        let t = rkyv::access::<super::record::ArchivedTables, rancor::Error>(m.body())
            .map_err(|e| CacheFileError::Invalid(e.to_string()))?;
        if t.arch.as_str() != arch {
            return Err(CacheFileError::Arch {
                found: t.arch.as_str().to_string(),
                want: arch.to_string(),
            });
        }
        Ok(m)
    }

    pub fn body(&self) -> &[u8] {
        &self.map[HEADER_LEN..]
    }

    /// The body bytes `[start, end)` copied into a buffer aligned like the body, preceded by
    /// `start % 16` bytes of padding so that archived values stay aligned.
    pub fn read_range(&self, start: usize, end: usize) -> std::io::Result<(AlignedVec, usize)> {
        use std::os::unix::fs::FileExt;
        let from = start & !15;
        let mut buf = AlignedVec::<16>::with_capacity(end - from);
        buf.resize(end - from, 0);
        self.file
            .read_exact_at(&mut buf, (HEADER_LEN + from) as u64)?;
        Ok((buf, start - from))
    }
}
