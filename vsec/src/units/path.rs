//! Absolute paths inside the guest image. Kept normalized (no `.`, `..`, empty or trailing
//! components) so that prefix rules compare whole components: `/data/safe` is a prefix of
//! `/data/safe/x` but not of `/data/safe-but-unsafe`.

use super::ValueError;
use std::fmt;

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbsPath(String);

impl AbsPath {
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let hint = "write an absolute path such as `/etc/motd`";
        if !s.starts_with('/') {
            return Err(ValueError::new(format!("`{s}` is not an absolute path")).hint(hint));
        }
        if s.contains('\0') {
            return Err(ValueError::new("path contains a NUL byte"));
        }
        if s.len() > 4096 {
            return Err(ValueError::new("path is longer than 4096 bytes"));
        }
        if s == "/" {
            return Ok(AbsPath(s.to_string()));
        }
        for comp in s[1..].split('/') {
            match comp {
                "" => {
                    return Err(ValueError::new(format!(
                        "`{s}` has an empty component (`//` or a trailing `/`)"
                    ))
                    .hint(hint));
                }
                "." | ".." => {
                    return Err(ValueError::new(format!("`{s}` contains `{comp}`"))
                        .hint("write the path without `.` and `..` components"));
                }
                _ => {}
            }
        }
        Ok(AbsPath(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// True when `self` is `dir` or lies below it, comparing whole components.
    pub fn is_within(&self, dir: &AbsPath) -> bool {
        let mut mine = self.components();
        dir.components().all(|d| mine.next() == Some(d))
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl serde::Serialize for AbsPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> AbsPath {
        AbsPath::parse(s).unwrap()
    }

    #[test]
    fn prefix_rules_compare_whole_components() {
        assert!(p("/data/safe").is_within(&p("/data/safe")));
        assert!(p("/data/safe/x").is_within(&p("/data/safe")));
        assert!(!p("/data/safe-but-unsafe").is_within(&p("/data/safe")));
        assert!(!p("/data").is_within(&p("/data/safe")));
        assert!(p("/etc").is_within(&p("/")));
    }

    #[test]
    fn refuses_unnormalized() {
        for bad in [
            "etc/motd",
            "/etc//motd",
            "/etc/",
            "/etc/../root",
            "/./x",
            "",
        ] {
            assert!(AbsPath::parse(bad).is_err(), "{bad}");
        }
    }
}
