//! Package patterns used by policies: a name glob with an optional version constraint,
//! e.g. `telnetd`, `linux-image-* (<< 6.1)`.

use super::name::PackageName;
use super::relation::{RelationError, VersionConstraint, parse_relation};
use super::version::DebVersion;
use std::fmt;

/// A name glob (`*`, `?`) plus an optional version constraint.
///
/// ```
/// use vsec::deb::{DebVersion, PackageName, PackagePattern};
/// let old_kernels = PackagePattern::parse("linux-image-* (<< 5.10)").unwrap();
/// let name = PackageName::new("linux-image-amd64").unwrap();
/// assert!(old_kernels.matches_name(&name));
/// assert!(old_kernels.matches(&name, &DebVersion::parse("4.19+105").unwrap()));
/// assert!(!old_kernels.matches(&name, &DebVersion::parse("6.1.76-1").unwrap()));
/// // The glob covers the whole name.
/// let telnetd = PackagePattern::parse("telnetd").unwrap();
/// assert!(!telnetd.matches_name(&PackageName::new("telnetd-ssl").unwrap()));
/// assert!(PackagePattern::parse("Bad Name").is_err());
/// ```
#[derive(Clone)]
pub struct PackagePattern {
    glob: String,
    matcher: wildmatch::WildMatch,
    pub constraint: Option<VersionConstraint>,
}

impl PackagePattern {
    /// Parses `glob [(op version)]`. The glob uses package-name characters plus `*` and `?`.
    pub fn parse(s: &str) -> Result<Self, RelationError> {
        let bad = |reason: &str| RelationError {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let s_trim = s.trim();
        let glob_end = s_trim.find(['(', ' ']).unwrap_or(s_trim.len());
        let glob = &s_trim[..glob_end];
        if glob.is_empty()
            || !glob
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+-.*?".contains(&c))
        {
            return Err(bad(
                "expected a package name glob (lowercase letters, digits, `+-.`, wildcards `*` and `?`)",
            ));
        }
        // Reuse the relation grammar for the constraint by substituting a placeholder name.
        let constraint = parse_relation(&format!("xx{}", &s_trim[glob_end..]))
            .map_err(|e| bad(&e.reason))?
            .constraint;
        Ok(PackagePattern {
            glob: glob.to_string(),
            matcher: wildmatch::WildMatch::new(glob),
            constraint,
        })
    }

    pub fn glob(&self) -> &str {
        &self.glob
    }

    pub fn matches_name(&self, name: &PackageName) -> bool {
        self.matcher.matches(name.as_str())
    }

    /// True when `name` at `version` falls under this pattern.
    pub fn matches(&self, name: &PackageName, version: &DebVersion) -> bool {
        self.matches_name(name) && self.constraint.as_ref().is_none_or(|c| c.matches(version))
    }
}

impl PartialEq for PackagePattern {
    fn eq(&self, other: &Self) -> bool {
        self.glob == other.glob && self.constraint == other.constraint
    }
}
impl Eq for PackagePattern {}

impl fmt::Display for PackagePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.glob)?;
        if let Some(c) = &self.constraint {
            write!(f, " {c}")?;
        }
        Ok(())
    }
}
impl fmt::Debug for PackagePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackagePattern({self})")
    }
}
impl serde::Serialize for PackagePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> serde::Deserialize<'de> for PackagePattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> PackageName {
        PackageName::new(s).unwrap()
    }
    fn v(s: &str) -> DebVersion {
        DebVersion::parse(s).unwrap()
    }

    #[test]
    fn glob_and_constraint_both_apply() {
        let p = PackagePattern::parse("linux-image-* (<< 6.1)").unwrap();
        assert!(p.matches(&n("linux-image-5.10.0-30-amd64"), &v("5.10.218-1")));
        assert!(!p.matches(&n("linux-image-6.1.0-37-cloud-amd64"), &v("6.1.140-1")));
        assert!(!p.matches(&n("linux-headers-5.10.0-30-amd64"), &v("5.10.218-1")));
        let t = PackagePattern::parse("telnetd").unwrap();
        assert!(t.matches(&n("telnetd"), &v("0.17-44")));
        assert!(!t.matches(&n("telnetd-ssl"), &v("0.17-44")));
        assert_eq!(p.to_string(), "linux-image-* (<< 6.1)");
    }

    #[test]
    fn rejects_bad_patterns() {
        for bad in ["", "Telnetd", "foo (>= )", "foo/bar", "linux-image-* (<< )"] {
            assert!(PackagePattern::parse(bad).is_err(), "{bad:?}");
        }
    }
}
