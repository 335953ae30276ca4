//! A [`Universe`] kept on disk as a memory-mapped rkyv archive, so that a later run reads
//! only what the solver touches.
//!
//! Why rkyv: it is maintained, its archives are read in place (zero-copy: name lookups are
//! binary searches over the mapped tables, package ids are slices of the mapping) and its
//! `bytecheck` validation makes reading a damaged or hostile file safe without trusting it.
//! Validation is done per part: the tables when the file is opened, each package record the
//! first time the solver asks for it, each after its xxh3 checksum matched. (Considered:
//! `zerocopy`-only structs would mean a hand-rolled layout for strings and nested relation
//! lists; `bincode`/`postcard` are not zero-copy and would decode all 65k packages on every
//! run, which is the cost this cache exists to avoid.)
//!
//! A touched package is turned into an owned [`Package`] once (the solver works on
//! `&Package`), so a lock pays for the few thousand packages it looks at, not for 65k.
//! A record that fails its checksum or validation mid-solve is reported through
//! [`Catalog::fault`]; the caller then throws the result away and rebuilds the file.

mod file;
mod record;

pub use file::{CacheFileError, FORMAT, write};

use super::universe::{Catalog, PkgId, Provider};
use crate::index::Package;
use file::Mapped;
use record::{ArchivedPkgRecord, ArchivedTables};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// A universe answered from a mapped cache file.
pub struct CachedUniverse {
    mapped: Mapped,
    /// Packages decoded so far (boxed: a reference handed out stays valid).
    slots: Vec<OnceLock<Box<Package>>>,
    fault: Mutex<Option<String>>,
}

impl std::fmt::Debug for CachedUniverse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedUniverse")
            .field("packages", &self.slots.len())
            .finish()
    }
}

impl CachedUniverse {
    /// Opens the file built for `key` and `arch`; any mismatch or damage is an error and the
    /// file is not used.
    pub fn open(path: &Path, key: &[u8; 32], arch: &str) -> Result<Self, CacheFileError> {
        let mapped = Mapped::open(path, key, arch)?;
        let mut u = CachedUniverse {
            mapped,
            slots: Vec::new(),
            fault: Mutex::new(None),
        };
        let n = u.tables().packages.len();
        let limit = u.mapped.tables_start as u64;
        if u.tables()
            .by_name
            .iter()
            .chain(u.tables().providers.iter())
            .flat_map(|e| e.ids.get().iter())
            .chain(u.tables().base.iter())
            .any(|id| id.to_native() as usize >= n)
            || u.tables().packages.iter().any(|l| {
                let (s, p, e) = (l.start.to_native(), l.pos.to_native(), l.end.to_native());
                !(s <= p && p < e && e <= limit)
            })
        {
            return Err(CacheFileError::Invalid(
                "a table points outside the file".into(),
            ));
        }
        u.slots = (0..n).map(|_| OnceLock::new()).collect();
        Ok(u)
    }

    fn tables(&self) -> &ArchivedTables<'static> {
        let body = self.mapped.body();
        // SAFETY: `Mapped::open` checked these exact bytes with `rkyv::access` (bytecheck)
        // and their checksum; the mapping is read-only and lives as long as `self`.
        unsafe { rkyv::access_unchecked::<ArchivedTables<'static>>(body) }
    }

    /// Reads, checks and decodes one record. Records are read with a positioned read rather
    /// than through the map: each becomes an owned `Package` anyway, and touching scattered
    /// records through a mapping makes the kernel map the pages around each one too
    /// (fault-around), so a lock's resident set would grow with the file, not with what it
    /// reads.
    fn decode(&self, id: PkgId) -> Result<Package, String> {
        let loc = &self.tables().packages[id as usize];
        let (start, end) = (loc.start.to_native() as usize, loc.end.to_native() as usize);
        let (buf, skip) = self
            .mapped
            .read_range(start, end)
            .map_err(|e| format!("package record {id}: {e}"))?;
        if file::xxh3(&buf[skip..]) != loc.hash.to_native() {
            return Err(format!("package record {id} fails its checksum"));
        }
        let pos = loc.pos.to_native() as usize - start + skip;
        let rec = rkyv::api::high::access_pos::<ArchivedPkgRecord, rkyv::rancor::Error>(&buf, pos)
            .map_err(|e| format!("package record {id}: {e}"))?;
        rec.to_package()
            .map_err(|e| format!("package record {id}: {e}"))
    }

    fn ids<'a>(
        table: &'a rkyv::vec::ArchivedVec<record::ArchivedNameIds>,
        name: &str,
    ) -> &'a [PkgId] {
        let Ok(i) = table.binary_search_by(|e| e.name.as_str().cmp(name)) else {
            return &[];
        };
        let ids: &[rkyv::rend::u32_le] = table[i].ids.get();
        // Little-endian archived integers are native ones on this (little-endian) host;
        // `Mapped::open` refuses big-endian hosts.
        zerocopy::FromBytes::ref_from_bytes(zerocopy::IntoBytes::as_bytes(ids))
            .expect("archived u32 slices are 4-aligned")
    }

    /// Packages decoded so far (for the benchmark and tests).
    pub fn decoded(&self) -> usize {
        self.slots.iter().filter(|s| s.get().is_some()).count()
    }
}

/// Stands in for a package whose record is damaged; its name matches no relation.
fn placeholder() -> Box<Package> {
    static P: OnceLock<Package> = OnceLock::new();
    Box::new(
        P.get_or_init(|| Package {
            name: crate::deb::PackageName::new("vse-damaged-cache-record").expect("valid"),
            version: crate::deb::DebVersion::parse("0").expect("valid"),
            architecture: crate::deb::Arch::new("none").expect("valid"),
            multi_arch: Default::default(),
            essential: false,
            priority: crate::index::Priority::Extra,
            depends: vec![],
            pre_depends: vec![],
            recommends: vec![],
            conflicts: vec![],
            breaks: vec![],
            replaces: vec![],
            provides: vec![],
            filename: String::new(),
            size: 0,
            sha256: String::new(),
            installed_size: None,
            repository: 0,
        })
        .clone(),
    )
}

impl Provider for CachedUniverse {
    fn package(&self, id: PkgId) -> &Package {
        self.slots[id as usize].get_or_init(|| match self.decode(id) {
            Ok(p) => Box::new(p),
            Err(why) => {
                let mut f = self.fault.lock().unwrap_or_else(|p| p.into_inner());
                f.get_or_insert(why);
                placeholder()
            }
        })
    }

    fn by_name(&self, name: &str) -> &[PkgId] {
        Self::ids(&self.tables().by_name, name)
    }

    fn providers(&self, name: &str) -> &[PkgId] {
        Self::ids(&self.tables().providers, name)
    }
}

impl Catalog for CachedUniverse {
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn names(&self) -> Vec<&str> {
        let t = self.tables();
        t.by_name
            .iter()
            .chain(t.providers.iter())
            .map(|e| e.name.as_str())
            .collect()
    }

    fn base_candidates(&self) -> Vec<PkgId> {
        self.tables().base.iter().map(|i| i.to_native()).collect()
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
