//! The archived shape of one package and of the lookup tables, and the conversions between
//! a parsed [`Package`] and its record.
//!
//! Records keep relationship fields already split into typed parts, so turning a record back
//! into a [`Package`] validates names and versions but never runs the relationship grammar
//! again: that is what makes a touched package cheap. Records borrow every string from the
//! parsed universe while they are written (rkyv's `AsString`), so writing one allocates
//! nothing per string and hashes nothing.

use crate::deb::{Alternatives, VersionOp};
use crate::deb::{Arch, ArchQualifier, DebVersion, PackageName, Relation, VersionConstraint};
use crate::index::{MultiArch, Package, Priority};
use rkyv::string::ArchivedString;
use rkyv::with::{AsString, InlineAsBox};

/// One relation (`name:qual (op version) [arch …]`).
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct RelRecord<'a> {
    #[rkyv(with = AsString)]
    name: &'a str,
    /// 0 none, 1 `:any`, 2 `:native`, 3 `:<qual_arch>`.
    qualifier: u8,
    /// 0 none, then `<<`, `<=`, `=`, `>=`, `>>`.
    op: u8,
    #[rkyv(with = AsString)]
    qual_arch: &'a str,
    #[rkyv(with = AsString)]
    version: &'a str,
    restrictions: Vec<Restriction<'a>>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct Restriction<'a> {
    negated: bool,
    #[rkyv(with = AsString)]
    arch: &'a str,
}

/// One binary package. Relationship fields are flattened: one list of relations, the
/// number of relations in each group, and the number of groups of each field (writing a
/// record then makes three allocations, not one per group).
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct PkgRecord<'a> {
    #[rkyv(with = AsString)]
    name: &'a str,
    #[rkyv(with = AsString)]
    version: &'a str,
    #[rkyv(with = AsString)]
    architecture: &'a str,
    multi_arch: u8,
    essential: bool,
    priority: u8,
    /// Depends, Pre-Depends, Recommends, Conflicts, Breaks, Replaces group by group, then
    /// Provides.
    rels: Vec<RelRecord<'a>>,
    group_lens: Vec<u16>,
    /// Groups in each of the six grouped fields, in the order above.
    field_groups: [u16; 6],
    #[rkyv(with = AsString)]
    filename: &'a str,
    size: u64,
    sha256: [u8; 32],
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
pub(super) struct NameIds<'a> {
    #[rkyv(with = AsString)]
    pub name: &'a str,
    #[rkyv(with = InlineAsBox)]
    pub ids: &'a [u32],
}

/// Everything but the packages: checked as a whole when the file is opened.
#[derive(rkyv::Archive, rkyv::Serialize)]
pub(super) struct Tables<'a> {
    pub arch: String,
    pub packages: Vec<Loc>,
    /// Sorted by name (binary search).
    pub by_name: Vec<NameIds<'a>>,
    /// Sorted by name.
    pub providers: Vec<NameIds<'a>>,
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

fn rel_record(r: &Relation) -> RelRecord<'_> {
    let (qualifier, qual_arch) = match &r.arch_qualifier {
        None => (0, ""),
        Some(ArchQualifier::Any) => (1, ""),
        Some(ArchQualifier::Native) => (2, ""),
        Some(ArchQualifier::Arch(a)) => (3, a.as_str()),
    };
    let (op, version) = match &r.constraint {
        None => (0, ""),
        Some(c) => (
            OPS.iter()
                .position(|o| *o == c.op)
                .map_or(0, |x| x as u8 + 1),
            c.version.as_str(),
        ),
    };
    RelRecord {
        name: r.name.as_str(),
        qualifier,
        op,
        qual_arch,
        version,
        restrictions: r
            .arch_restrictions
            .iter()
            .map(|(negated, a)| Restriction {
                negated: *negated,
                arch: a.as_str(),
            })
            .collect(),
    }
}

impl<'a> PkgRecord<'a> {
    pub(super) fn of(p: &'a Package) -> PkgRecord<'a> {
        let mut sha256 = [0u8; 32];
        // Index SHA256 fields are checked to be 64 hex digits when parsed.
        let _ = hex::decode_to_slice(&p.sha256, &mut sha256);
        let fields = [
            &p.depends,
            &p.pre_depends,
            &p.recommends,
            &p.conflicts,
            &p.breaks,
            &p.replaces,
        ];
        let n: usize = fields.iter().flat_map(|f| f.iter()).map(Vec::len).sum();
        let mut rels = Vec::with_capacity(n + p.provides.len());
        let mut group_lens = Vec::with_capacity(fields.iter().map(|f| f.len()).sum());
        let mut field_groups = [0u16; 6];
        for (k, f) in fields.iter().enumerate() {
            field_groups[k] = f.len() as u16;
            for g in f.iter() {
                group_lens.push(g.len() as u16);
                rels.extend(g.iter().map(rel_record));
            }
        }
        rels.extend(p.provides.iter().map(rel_record));
        PkgRecord {
            name: p.name.as_str(),
            version: p.version.as_str(),
            architecture: p.architecture.as_str(),
            multi_arch: MULTI_ARCH
                .iter()
                .position(|m| *m == p.multi_arch)
                .unwrap_or(0) as u8,
            essential: p.essential,
            priority: PRIORITIES
                .iter()
                .position(|x| *x == p.priority)
                .unwrap_or(3) as u8,
            rels,
            group_lens,
            field_groups,
            filename: &p.filename,
            size: p.size,
            sha256,
            installed_size: p.installed_size,
            repository: p.repository as u32,
        }
    }
}

/// Why a record could not be turned back into a package (only a damaged or foreign file).
pub(super) type DecodeError = String;

fn name(s: &ArchivedString) -> Result<PackageName, DecodeError> {
    PackageName::new(s.as_str()).map_err(|e| e.to_string())
}

fn arch(s: &ArchivedString) -> Result<Arch, DecodeError> {
    Arch::new(s.as_str()).map_err(|e| e.to_string())
}

fn version(s: &ArchivedString) -> Result<DebVersion, DecodeError> {
    DebVersion::parse(s.as_str()).map_err(|e| e.to_string())
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

impl ArchivedPkgRecord<'_> {
    /// The package this record was made from; every name and version is validated again.
    pub(super) fn to_package(&self) -> Result<Package, DecodeError> {
        let mut rels = self.rels.iter();
        let mut lens = self.group_lens.iter();
        let mut fields: [Vec<Alternatives>; 6] = Default::default();
        for (k, f) in fields.iter_mut().enumerate() {
            let groups = self.field_groups[k].to_native();
            f.reserve(usize::from(groups));
            for _ in 0..groups {
                let len = lens
                    .next()
                    .ok_or("group count beyond the groups")?
                    .to_native();
                let g = (0..len)
                    .map(|_| relation(rels.next().ok_or("group beyond the relations")?))
                    .collect::<Result<Alternatives, DecodeError>>()?;
                f.push(g);
            }
        }
        let provides = rels.map(relation).collect::<Result<_, _>>()?;
        let [
            depends,
            pre_depends,
            recommends,
            conflicts,
            breaks,
            replaces,
        ] = fields;
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
            depends,
            pre_depends,
            recommends,
            conflicts,
            breaks,
            replaces,
            provides,
            filename: self.filename.as_str().to_string(),
            size: self.size.to_native(),
            sha256: hex::encode(self.sha256),
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
