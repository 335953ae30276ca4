//! Debian version numbers, compared exactly as dpkg does (`[epoch:]upstream[-revision]`).
//!
//! Equality follows dpkg, not string equality: `1.0`, `0:1.0` and `1.0-0` are the same
//! version. The original text is kept for display and round-tripping into lockfiles.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Why a version string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("empty version string")]
    Empty,
    #[error("epoch `{0}` is not a number")]
    BadEpoch(String),
    #[error("version `{0}` has an empty upstream part")]
    EmptyUpstream(String),
    #[error("upstream version `{0}` must start with a digit")]
    UpstreamNotDigit(String),
    #[error(
        "invalid character {1:?} in version `{0}` (allowed: letters, digits, `.+~-`, and `:` after an epoch)"
    )]
    BadChar(String, char),
}

/// A validated Debian version, ordered as dpkg orders it.
///
/// ```
/// use vsec::deb::DebVersion;
/// let v = |s: &str| DebVersion::parse(s).unwrap();
/// // `~` sorts before the end of the string: a release candidate comes before the release.
/// assert!(v("1.0~rc1") < v("1.0"));
/// assert!(v("1.0") < v("1.0-1") && v("1.0-1") < v("1.0-1+b1"));
/// // Digit runs compare as numbers, and any epoch beats a higher upstream version.
/// assert!(v("1.9") < v("1.10"));
/// assert!(v("9.9") < v("1:0.1"));
/// // dpkg's equality, with the original text kept for display.
/// assert_eq!(v("0:1.0-0"), v("1.0"));
/// assert_eq!(v("0:1.0-0").to_string(), "0:1.0-0");
/// assert!(DebVersion::parse("1.0 beta").is_err());
/// ```
#[derive(Clone)]
pub struct DebVersion {
    text: String,
    epoch: u64,
    /// Byte ranges into `text` of the upstream and revision parts.
    upstream: (usize, usize),
    revision: (usize, usize),
}

impl DebVersion {
    pub fn parse(s: &str) -> Result<Self, VersionError> {
        let text = s.trim();
        if text.is_empty() {
            return Err(VersionError::Empty);
        }
        let (epoch, rest_start) = match text.find(':') {
            Some(i) => {
                let e = &text[..i];
                let epoch = e
                    .parse::<u64>()
                    .map_err(|_| VersionError::BadEpoch(e.to_string()))?;
                (epoch, i + 1)
            }
            None => (0, 0),
        };
        let rest = &text[rest_start..];
        let (up_end, rev) = match rest.rfind('-') {
            Some(i) => (rest_start + i, (rest_start + i + 1, text.len())),
            None => (text.len(), (text.len(), text.len())),
        };
        let upstream = &text[rest_start..up_end];
        if upstream.is_empty() {
            return Err(VersionError::EmptyUpstream(text.to_string()));
        }
        if !upstream.as_bytes()[0].is_ascii_digit() {
            return Err(VersionError::UpstreamNotDigit(text.to_string()));
        }
        let has_epoch = rest_start > 0;
        for c in upstream.chars() {
            let ok = c.is_ascii_alphanumeric()
                || matches!(c, '.' | '+' | '~' | '-')
                || (c == ':' && has_epoch);
            if !ok {
                return Err(VersionError::BadChar(text.to_string(), c));
            }
        }
        for c in text[rev.0..rev.1].chars() {
            if !(c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~')) {
                return Err(VersionError::BadChar(text.to_string(), c));
            }
        }
        Ok(DebVersion {
            text: text.to_string(),
            epoch,
            upstream: (rest_start, up_end),
            revision: rev,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn upstream(&self) -> &str {
        &self.text[self.upstream.0..self.upstream.1]
    }
    pub fn revision(&self) -> &str {
        &self.text[self.revision.0..self.revision.1]
    }
}

/// dpkg's character order: `~` sorts before everything (even the end of the string),
/// letters before non-letters.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => c as i32,
        Some(b'~') => -1,
        Some(c) => c as i32 + 256,
    }
}

/// dpkg's `verrevcmp`: alternating non-digit and digit runs.
fn verrevcmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

impl Ord for DebVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| verrevcmp(self.upstream().as_bytes(), other.upstream().as_bytes()))
            .then_with(|| verrevcmp(self.revision().as_bytes(), other.revision().as_bytes()))
    }
}
impl PartialOrd for DebVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for DebVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for DebVersion {}

impl fmt::Display for DebVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
impl fmt::Debug for DebVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DebVersion({})", self.text)
    }
}
impl FromStr for DebVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}
impl serde::Serialize for DebVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}
impl<'de> serde::Deserialize<'de> for DebVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(a: &str, b: &str) -> Ordering {
        DebVersion::parse(a)
            .unwrap()
            .cmp(&DebVersion::parse(b).unwrap())
    }

    #[test]
    fn dpkg_ordering_rules() {
        use Ordering::*;
        let cases = [
            ("1.0", "1.0-0", Equal),
            ("0:1.0", "1.0", Equal),
            ("1.0~rc1", "1.0", Less),
            ("1.0~~", "1.0~", Less),
            ("1.0", "1.0+b1", Less),
            ("1:0.1", "2.0", Greater),
            ("1.01", "1.1", Equal),
            ("1.0a", "1.0+", Less),
            ("2.30-1", "2.4-1", Greater),
            ("1.2-3ubuntu1", "1.2-3", Greater),
            ("7.88.1-10+deb12u5", "7.88.1-10+deb12u12", Less),
            ("1:2.3.4-1", "1:2.3.4-1~bpo12+1", Greater),
        ];
        for (a, b, want) in cases {
            assert_eq!(cmp(a, b), want, "{a} vs {b}");
            assert_eq!(cmp(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn parts_are_split_at_first_colon_and_last_hyphen() {
        let v = DebVersion::parse("2:1.2-rc-3").unwrap();
        assert_eq!((v.epoch(), v.upstream(), v.revision()), (2, "1.2-rc", "3"));
    }

    #[test]
    fn rejects_malformed_versions() {
        for bad in ["", "a1.0", "x:1.0", "1.0 beta", "1.0-a_b", ":1"] {
            assert!(DebVersion::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
