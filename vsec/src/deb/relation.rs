//! Relationship fields (`Depends`, `Pre-Depends`, `Conflicts`, `Provides`, …) and the version
//! constraints users write in specs (`openmpi-bin (>= 4.1)`), parsed with nom.
//!
//! Grammar (Debian Policy §7.1): a comma-separated list of alternatives separated by `|`;
//! each alternative is `name[:archqual] [(op version)] [[arch …]] [<profile …> …]`.

use super::name::{Arch, NameError, PackageName};
use super::version::{DebVersion, VersionError};
use nom::branch::alt;
use nom::bytes::complete::{tag, take_till, take_while1};
use nom::character::complete::{char, multispace0};
use nom::combinator::{all_consuming, map, opt};
use nom::multi::{many0, separated_list1};
use nom::sequence::{delimited, preceded};
use nom::{IResult, Parser};
use std::fmt;

/// A version comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum VersionOp {
    #[serde(rename = "<<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = "=")]
    Eq,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = ">>")]
    Gt,
}

impl VersionOp {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionOp::Lt => "<<",
            VersionOp::Le => "<=",
            VersionOp::Eq => "=",
            VersionOp::Ge => ">=",
            VersionOp::Gt => ">>",
        }
    }
}

/// `(op version)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionConstraint {
    pub op: VersionOp,
    pub version: DebVersion,
}

impl VersionConstraint {
    pub fn matches(&self, v: &DebVersion) -> bool {
        use std::cmp::Ordering::*;
        let o = v.cmp(&self.version);
        match self.op {
            VersionOp::Lt => o == Less,
            VersionOp::Le => o != Greater,
            VersionOp::Eq => o == Equal,
            VersionOp::Ge => o != Less,
            VersionOp::Gt => o == Greater,
        }
    }
}

impl fmt::Display for VersionConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({} {})", self.op.as_str(), self.version)
    }
}

/// The `:qualifier` after a package name in a relationship.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchQualifier {
    Any,
    Native,
    Arch(Arch),
}

/// One alternative: a package, optionally qualified and version-constrained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub name: PackageName,
    pub arch_qualifier: Option<ArchQualifier>,
    pub constraint: Option<VersionConstraint>,
    /// `[amd64 !i386]` restrictions (source packages only); `(negated, arch)`.
    pub arch_restrictions: Vec<(bool, Arch)>,
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        match &self.arch_qualifier {
            Some(ArchQualifier::Any) => write!(f, ":any")?,
            Some(ArchQualifier::Native) => write!(f, ":native")?,
            Some(ArchQualifier::Arch(a)) => write!(f, ":{a}")?,
            None => {}
        }
        if let Some(c) = &self.constraint {
            write!(f, " {c}")?;
        }
        Ok(())
    }
}

/// Serialized as its Debian text form, e.g. `openmpi-bin (>= 4.1)`.
impl serde::Serialize for Relation {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A group of alternatives (`a | b`): satisfied by any one of them.
pub type Alternatives = Vec<Relation>;

/// Why a relationship field failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid relationship `{input}`: {reason}")]
pub struct RelationError {
    pub input: String,
    pub reason: String,
}

impl vse_exit::Classify for RelationError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

fn ws<'a, O, P>(p: P) -> impl Parser<&'a str, Output = O, Error = nom::error::Error<&'a str>>
where
    P: Parser<&'a str, Output = O, Error = nom::error::Error<&'a str>>,
{
    delimited(multispace0, p, multispace0)
}

fn name_token(i: &str) -> IResult<&str, &str> {
    take_while1(|c: char| c.is_ascii_alphanumeric() || "+-._".contains(c)).parse(i)
}

fn op(i: &str) -> IResult<&str, VersionOp> {
    alt((
        map(tag("<<"), |_| VersionOp::Lt),
        map(tag("<="), |_| VersionOp::Le),
        map(tag(">="), |_| VersionOp::Ge),
        map(tag(">>"), |_| VersionOp::Gt),
        map(tag("="), |_| VersionOp::Eq),
        // Obsolete forms that dpkg still accepts with their historical meaning.
        map(tag("<"), |_| VersionOp::Le),
        map(tag(">"), |_| VersionOp::Ge),
    ))
    .parse(i)
}

fn raw_constraint(i: &str) -> IResult<&str, (VersionOp, &str)> {
    delimited(
        ws(char('(')),
        (ws(op), take_till(|c: char| c == ')' || c.is_whitespace())),
        ws(char(')')),
    )
    .parse(i)
}

fn raw_relation(i: &str) -> IResult<&str, RawRelation<'_>> {
    let (i, name) = ws(name_token).parse(i)?;
    // ws(): `nodejs:any | nodejs (<< 12)` has blanks after a qualifier.
    let (i, qual) = opt(preceded(char(':'), ws(name_token))).parse(i)?;
    let (i, constraint) = opt(raw_constraint).parse(i)?;
    let (i, archs) = opt(delimited(
        ws(char('[')),
        many0(ws((opt(char('!')), name_token))),
        ws(char(']')),
    ))
    .parse(i)?;
    // Build profiles are only meaningful for source packages: parsed and dropped.
    let (i, _) = many0(ws(delimited(char('<'), take_till(|c| c == '>'), char('>')))).parse(i)?;
    Ok((
        i,
        RawRelation {
            name,
            qual,
            constraint,
            archs: archs.unwrap_or_default(),
        },
    ))
}

struct RawRelation<'a> {
    name: &'a str,
    qual: Option<&'a str>,
    constraint: Option<(VersionOp, &'a str)>,
    archs: Vec<(Option<char>, &'a str)>,
}

/// A well-formed relation with a bad name, architecture or version in it.
#[derive(Debug, thiserror::Error)]
enum PartError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Version(#[from] VersionError),
}

impl RawRelation<'_> {
    fn validate(self) -> Result<Relation, PartError> {
        let name = PackageName::new(self.name)?;
        let arch_qualifier = match self.qual {
            None => None,
            Some("any") => Some(ArchQualifier::Any),
            Some("native") => Some(ArchQualifier::Native),
            Some(a) => Some(ArchQualifier::Arch(Arch::new(a)?)),
        };
        let constraint = match self.constraint {
            None => None,
            Some((op, v)) => Some(VersionConstraint {
                op,
                version: DebVersion::parse(v)?,
            }),
        };
        let arch_restrictions = self
            .archs
            .into_iter()
            .map(|(neg, a)| Arch::new(a).map(|a| (neg.is_some(), a)))
            .collect::<Result<_, _>>()?;
        Ok(Relation {
            name,
            arch_qualifier,
            constraint,
            arch_restrictions,
        })
    }
}

fn err(input: &str, reason: impl Into<String>) -> RelationError {
    RelationError {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses one relation, e.g. `openmpi-bin (>= 4.1)`.
///
/// ```
/// use vsec::deb::{DebVersion, VersionOp, parse_relation};
/// let r = parse_relation("openmpi-bin (>= 4.1)").unwrap();
/// assert_eq!(r.name.as_str(), "openmpi-bin");
/// let c = r.constraint.as_ref().unwrap();
/// assert_eq!(c.op, VersionOp::Ge);
/// assert!(c.matches(&DebVersion::parse("4.1.4-3").unwrap()));
/// assert!(!c.matches(&DebVersion::parse("4.0.6-8").unwrap()));
/// assert_eq!(r.to_string(), "openmpi-bin (>= 4.1)");
/// assert!(parse_relation("openmpi-bin (>= )").is_err());
/// ```
pub fn parse_relation(s: &str) -> Result<Relation, RelationError> {
    let (_, raw) = all_consuming(raw_relation).parse(s).map_err(|_| {
        err(
            s,
            "expected `name [(op version)]` with op one of << <= = >= >>",
        )
    })?;
    raw.validate().map_err(|e| err(s, e.to_string()))
}

/// Parses a whole relationship field into groups of alternatives.
/// An empty or all-whitespace field is an empty list.
pub fn parse_relations(s: &str) -> Result<Vec<Alternatives>, RelationError> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let group = separated_list1(char('|'), raw_relation);
    let (_, groups) = all_consuming(separated_list1(char(','), group))
        .parse(s)
        .map_err(|_| {
            err(
                s,
                "expected `name [(op version)]`, separated by `,` and `|`",
            )
        })?;
    groups
        .into_iter()
        .map(|g| g.into_iter().map(RawRelation::validate).collect())
        .collect::<Result<_, _>>()
        .map_err(|e: PartError| err(s, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_depends_field() {
        let f = "libc6 (>= 2.34), libgcc-s1 (>= 3.0) | libgcc1, python3:any, perl:native (<< 5.37~), foo [amd64 !i386] <!nocheck>";
        let groups = parse_relations(f).unwrap();
        assert_eq!(groups.len(), 5);
        assert_eq!(groups[1].len(), 2);
        assert_eq!(groups[1][1].name.as_str(), "libgcc1");
        let c = groups[0][0].constraint.as_ref().unwrap();
        assert_eq!((c.op, c.version.as_str()), (VersionOp::Ge, "2.34"));
        assert_eq!(groups[2][0].arch_qualifier, Some(ArchQualifier::Any));
        assert_eq!(groups[3][0].to_string(), "perl:native (<< 5.37~)");
        assert_eq!(groups[4][0].arch_restrictions.len(), 2);
    }

    #[test]
    fn constraint_semantics() {
        let r = parse_relation("openmpi-bin (>= 4.1)").unwrap();
        let c = r.constraint.unwrap();
        assert!(c.matches(&DebVersion::parse("4.1.4-3").unwrap()));
        assert!(!c.matches(&DebVersion::parse("4.0.9").unwrap()));
        let lt = parse_relation("x11 (<< 1.0~)").unwrap().constraint.unwrap();
        assert!(!lt.matches(&DebVersion::parse("1.0~rc1").unwrap()));
        assert!(lt.matches(&DebVersion::parse("0.9").unwrap()));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for bad in [
            "openmpi-bin (=> 4.1)",
            "foo (>= )",
            "Foo",
            "a, , b",
            "foo (>= 1.0",
            "foo | ",
        ] {
            let e = parse_relations(bad).unwrap_err();
            assert!(!e.reason.is_empty(), "{bad}");
        }
    }
}
