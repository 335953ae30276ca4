//! Validated Debian package and architecture names.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "package name `{0}` is invalid: names are lowercase letters, digits and `+-.`, start with a letter or digit, and are at least two characters long"
    )]
    Package(String),
    #[error(
        "architecture `{0}` is invalid: expected lowercase letters, digits and `-` (e.g. amd64, all, any)"
    )]
    Arch(String),
}

/// A Debian package name (Debian Policy §5.6.1).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackageName(String);

impl PackageName {
    pub fn new(s: &str) -> Result<Self, NameError> {
        let b = s.as_bytes();
        let ok = b.len() >= 2
            && b[0].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+-.".contains(c));
        if ok {
            Ok(PackageName(s.to_string()))
        } else {
            Err(NameError::Package(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A Debian architecture name, including the wildcards `any` and `all`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch(String);

impl Arch {
    pub fn new(s: &str) -> Result<Self, NameError> {
        let ok = !s.is_empty()
            && s.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        if ok {
            Ok(Arch(s.to_string()))
        } else {
            Err(NameError::Arch(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_newtype_impls {
    ($t:ident) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self.0)
            }
        }
        impl std::str::FromStr for $t {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(&s).map_err(serde::de::Error::custom)
            }
        }
        impl std::borrow::Borrow<str> for $t {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}
string_newtype_impls!(PackageName);
string_newtype_impls!(Arch);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_real_names_and_rejects_bad_ones() {
        for ok in [
            "libc6",
            "g++",
            "libstdc++6",
            "python3.11",
            "0ad",
            "lib32z1-dev",
        ] {
            assert!(PackageName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a", "Libc6", "-foo", "foo_bar", "foo bar", "föö"] {
            assert!(PackageName::new(bad).is_err(), "{bad}");
        }
    }
}
