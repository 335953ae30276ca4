//! The archived shape of one package and of the lookup tables, and the conversions between
//! a parsed [`Package`] and its record.
//!
//! Records keep relationship fields already split into typed parts, so turning a record back
//! into a [`Package`] validates names and versions but never runs the relationship grammar
//! again: that is what makes a touched package cheap.

use crate::deb::{Alternatives, VersionOp};
use crate::deb::{Arch, ArchQualifier, DebVersion, PackageName, Relation, VersionConstraint};
use crate::index::{MultiArch, Package, Priority};

/// One relation (`name:qual (op version) [arch …]`).
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct RelRecord {
    name: String,
    /// 0 none, 1 `:any`, 2 `:native`, 3 `:<qual_arch>`.
    qualifier: u8,
    qual_arch: String,
    /// 0 none, then `<<`, `<=`, `=`, `>=`, `>>`.
    op: u8,
    version: String,
    restrictions: Vec<Restriction>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct Restriction {
    negated: bool,
    arch: String,
}

/// One binary package, field for field.
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct PkgRecord {
    name: String,
    version: String,
    architecture: String,
    multi_arch: u8,
    essential: bool,
    priority: u8,
    depends: Vec<Vec<RelRecord>>,
    pre_depends: Vec<Vec<RelRecord>>,
    recommends: Vec<Vec<RelRecord>>,
    conflicts: Vec<Vec<RelRecord>>,
    breaks: Vec<Vec<RelRecord>>,
    replaces: Vec<Vec<RelRecord>>,
    provides: Vec<RelRecord>,
    filename: String,
    size: u64,
    sha256: String,
    installed_size: Option<u64>,
    repository: u32,
}

/// Where a package record lies in the body and what its bytes hash to.
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct Loc {
    /// Root position of the record (its last bytes).
    pub pos: u64,
    /// The record's byte range, strings and vectors included.
    pub start: u64,
    pub end: u64,
    pub hash: u64,
}

/// A name and the package ids under it, in the provider's order.
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct NameIds {
    pub name: String,
    pub ids: Vec<u32>,
}

/// Everything but the packages: checked as a whole when the file is opened.
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct Tables {
    pub arch: String,
    pub packages: Vec<Loc>,
    /// Sorted by name (binary search).
    pub by_name: Vec<NameIds>,
    /// Sorted by name.
    pub providers: Vec<NameIds>,
    /// Essential packages and those of priority standard or higher.
    pub base: Vec<u32>,
}

const OPS: [VersionOp; 5] = [
    VersionOp::Lt,
    VersionOp::Le,
    VersionOp::Eq,
    VersionOp::Ge,
    VersionOp::Gt,
];
const PRIORITIES: [Priority; 5] = [
    Priority::Required,
    Priority::Important,
    Priority::Standard,
    Priority::Optional,
    Priority::Extra,
];
const MULTI_ARCH: [MultiArch; 4] = [
    MultiArch::No,
    MultiArch::Same,
    MultiArch::Foreign,
    MultiArch::Allowed,
];

fn rel_record(r: &Relation) -> RelRecord {
    let (qualifier, qual_arch) = match &r.arch_qualifier {
        None => (0, String::new()),
        Some(ArchQualifier::Any) => (1, String::new()),
        Some(ArchQualifier::Native) => (2, String::new()),
        Some(ArchQualifier::Arch(a)) => (3, a.as_str().to_string()),
    };
    let (op, version) = match &r.constraint {
        None => (0, String::new()),
        Some(c) => (
            OPS.iter()
                .position(|o| *o == c.op)
                .map_or(0, |i| i as u8 + 1),
            c.version.as_str().to_string(),
        ),
    };
    RelRecord {
        name: r.name.as_str().to_string(),
        qualifier,
        qual_arch,
        op,
        version,
        restrictions: r
            .arch_restrictions
            .iter()
            .map(|(negated, a)| Restriction {
                negated: *negated,
                arch: a.as_str().to_string(),
            })
            .collect(),
    }
}

fn groups(gs: &[Alternatives]) -> Vec<Vec<RelRecord>> {
    gs.iter()
        .map(|g| g.iter().map(rel_record).collect())
        .collect()
}

impl PkgRecord {
    pub(super) fn of(p: &Package) -> PkgRecord {
        PkgRecord {
            name: p.name.as_str().to_string(),
            version: p.version.as_str().to_string(),
            architecture: p.architecture.as_str().to_string(),
            multi_arch: MULTI_ARCH
                .iter()
                .position(|m| *m == p.multi_arch)
                .unwrap_or(0) as u8,
            essential: p.essential,
            priority: PRIORITIES
                .iter()
                .position(|x| *x == p.priority)
                .unwrap_or(3) as u8,
            depends: groups(&p.depends),
            pre_depends: groups(&p.pre_depends),
            recommends: groups(&p.recommends),
            conflicts: groups(&p.conflicts),
            breaks: groups(&p.breaks),
            replaces: groups(&p.replaces),
            provides: p.provides.iter().map(rel_record).collect(),
            filename: p.filename.clone(),
            size: p.size,
            sha256: p.sha256.clone(),
            installed_size: p.installed_size,
            repository: p.repository as u32,
        }
    }
}

/// Why a record could not be turned back into a package (only a damaged or foreign file).
pub(super) type DecodeError = String;

fn name(s: &str) -> Result<PackageName, DecodeError> {
    PackageName::new(s).map_err(|e| e.to_string())
}

fn arch(s: &str) -> Result<Arch, DecodeError> {
    Arch::new(s).map_err(|e| e.to_string())
}

fn version(s: &str) -> Result<DebVersion, DecodeError> {
    DebVersion::parse(s).map_err(|e| e.to_string())
}

fn relation(r: &ArchivedRelRecord) -> Result<Relation, DecodeError> {
    let arch_qualifier = match r.qualifier {
        0 => None,
        1 => Some(ArchQualifier::Any),
        2 => Some(ArchQualifier::Native),
        3 => Some(ArchQualifier::Arch(arch(&r.qual_arch)?)),
        q => return Err(format!("unknown architecture qualifier {q}")),
    };
    let constraint = match r.op {
        0 => None,
        o => Some(VersionConstraint {
            op: *OPS
                .get(usize::from(o) - 1)
                .ok_or_else(|| format!("unknown version operator {o}"))?,
            version: version(&r.version)?,
        }),
    };
    Ok(Relation {
        name: name(&r.name)?,
        arch_qualifier,
        constraint,
        arch_restrictions: r
            .restrictions
            .iter()
            .map(|x| Ok((x.negated, arch(&x.arch)?)))
            .collect::<Result<_, DecodeError>>()?,
    })
}

fn alternatives(
    gs: &rkyv::vec::ArchivedVec<rkyv::vec::ArchivedVec<ArchivedRelRecord>>,
) -> Result<Vec<Alternatives>, DecodeError> {
    gs.iter()
        .map(|g| g.iter().map(relation).collect())
        .collect()
}

impl ArchivedPkgRecord {
    /// The package this record was made from; every name and version is validated again.
    pub(super) fn to_package(&self) -> Result<Package, DecodeError> {
        Ok(Package {
            name: name(&self.name)?,
            version: version(&self.version)?,
            architecture: arch(&self.architecture)?,
            multi_arch: *MULTI_ARCH
                .get(usize::from(self.multi_arch))
                .ok_or("unknown Multi-Arch value")?,
            essential: self.essential,
            priority: *PRIORITIES
                .get(usize::from(self.priority))
                .ok_or("unknown priority")?,
            depends: alternatives(&self.depends)?,
            pre_depends: alternatives(&self.pre_depends)?,
            recommends: alternatives(&self.recommends)?,
            conflicts: alternatives(&self.conflicts)?,
            breaks: alternatives(&self.breaks)?,
            replaces: alternatives(&self.replaces)?,
            provides: self
                .provides
                .iter()
                .map(relation)
                .collect::<Result<_, _>>()?,
            filename: self.filename.as_str().to_string(),
            size: self.size.to_native(),
            sha256: self.sha256.as_str().to_string(),
            installed_size: self.installed_size.as_ref().map(|v| v.to_native()),
            repository: self.repository.to_native() as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::PackagesIndex;
    use std::path::Path;

    #[test]
    fn a_record_gives_back_the_same_package() {
        let text = "Package: libfoo1\nVersion: 1:2.3~rc1-4+b1\nArchitecture: amd64\nMulti-Arch: same\nPriority: important\nPre-Depends: libc6 (>= 2.34)\nDepends: aa:any (<< 3) | bb:native, cc:amd64 [amd64 !i386], dd (= 1.0-1)\nRecommends: rr\nConflicts: xx (>> 1)\nBreaks: yy (<= 2)\nReplaces: zz\nProvides: foo (= 2.3), bar\nFilename: pool/main/f/foo/libfoo1.deb\nSize: 10\nInstalled-Size: 42\nSHA256: 0c1f20b54d7d8a2ab7d6b9e7f6e0f7c2e8e6c0d1c3e3b6c7d1a1b7c2e3f4a5b6\n";
        let idx = PackagesIndex::parse(Path::new("P"), text, 7).unwrap();
        let p = &idx.packages[0];
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&PkgRecord::of(p)).unwrap();
        let a = rkyv::access::<ArchivedPkgRecord, rkyv::rancor::Error>(&bytes).unwrap();
        let back = a.to_package().unwrap();
        assert_eq!(format!("{p:?}"), format!("{back:?}"));
        assert_eq!(back.depends[0][0].to_string(), "aa:any (<< 3)");
    }
}
