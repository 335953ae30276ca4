//! Small validated names: distribution words, Unix user/group names, file modes,
//! hypervisors, mirror URLs and VM hostname patterns.

use super::ValueError;
use std::fmt;

macro_rules! string_newtype {
    ($t:ident) => {
        impl $t {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.0)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

/// A lowercase identifier as used for distributions, suites, components and variants.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Word(String);
string_newtype!(Word);

impl Word {
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-.+_".contains(&c));
        if ok {
            Ok(Word(s.to_string()))
        } else {
            Err(ValueError::new(format!("`{s}` is not a valid name"))
                .hint("use lowercase letters, digits and `-._+`, e.g. `bookworm`"))
        }
    }
}

/// A user or group name as `useradd` accepts it (Debian's default NAME_REGEX).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixName(String);
string_newtype!(UnixName);

impl UnixName {
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let ok = !s.is_empty()
            && s.len() <= 32
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
        if ok {
            Ok(UnixName(s.to_string()))
        } else {
            Err(ValueError::new(format!("`{s}` is not a valid user or group name"))
                .hint("start with a lowercase letter or `_`; then lowercase letters, digits, `_` or `-`; at most 32 characters"))
        }
    }
}

/// Permission bits of a file, written in octal (`"0644"`, `"0755"`, `"4755"`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(u32);

impl FileMode {
    pub const DEFAULT: FileMode = FileMode(0o644);

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let t = s.trim();
        let digits = t.strip_prefix("0o").unwrap_or(t);
        if (3..=4).contains(&digits.len()) && digits.bytes().all(|c| (b'0'..=b'7').contains(&c)) {
            // Checked: 3 or 4 octal digits always fit.
            Ok(FileMode(u32::from_str_radix(digits, 8).unwrap_or(0)))
        } else {
            Err(ValueError::new(format!("`{s}` is not a file mode"))
                .hint("write the mode as 3 or 4 octal digits in quotes, e.g. `mode: \"0644\"`"))
        }
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl fmt::Debug for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for FileMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A virtualization solution a V2M plugin can drive. The image itself stays agnostic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hypervisor {
    Qemu,
    Libvirt,
    Xen,
    Palacios,
}

impl Hypervisor {
    pub const ALL: [Hypervisor; 4] = [
        Hypervisor::Qemu,
        Hypervisor::Libvirt,
        Hypervisor::Xen,
        Hypervisor::Palacios,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Hypervisor::Qemu => "qemu",
            Hypervisor::Libvirt => "libvirt",
            Hypervisor::Xen => "xen",
            Hypervisor::Palacios => "palacios",
        }
    }

    pub fn parse(s: &str) -> Result<Self, ValueError> {
        Hypervisor::ALL
            .into_iter()
            .find(|h| h.as_str() == s)
            .ok_or_else(|| {
                let names = Hypervisor::ALL.map(Hypervisor::as_str);
                let hint = match crate::yaml::did_you_mean(s, names) {
                    Some(m) => format!("did you mean `{m}`? known: {}", names.join(", ")),
                    None => format!("known: {}", names.join(", ")),
                };
                ValueError::new(format!("unknown hypervisor `{s}`")).hint(hint)
            })
    }
}

impl fmt::Display for Hypervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An archive base URL, `http(s)://host[/path]`, kept without a trailing slash.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MirrorUrl(String);
string_newtype!(MirrorUrl);

impl MirrorUrl {
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let hint = "write the archive root, e.g. `http://mirror.example.org/debian`";
        let rest = s
            .strip_prefix("http://")
            .or_else(|| s.strip_prefix("https://"))
            .ok_or_else(|| ValueError::new(format!("`{s}` is not an http(s) URL")).hint(hint))?;
        let host = rest.split('/').next().unwrap_or("");
        let valid = !host.is_empty()
            && rest
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-._~/:%+@".contains(&c))
            && !rest.contains("//");
        if !valid {
            return Err(ValueError::new(format!("`{s}` is not a valid mirror URL")).hint(hint));
        }
        Ok(MirrorUrl(s.trim_end_matches('/').to_string()))
    }

    /// True when `self` is `base` or below it, comparing whole path components.
    pub fn is_within(&self, base: &MirrorUrl) -> bool {
        self.0 == base.0
            || self
                .0
                .strip_prefix(&base.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// The hostname each VM gets, e.g. `vm-{job}-{rank}`. Placeholders: `{job}` (batch job id),
/// `{rank}` (VM index in the job), `{node}` (host node name).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HostnamePattern(String);
string_newtype!(HostnamePattern);

const PLACEHOLDERS: [&str; 3] = ["job", "rank", "node"];

impl HostnamePattern {
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let hint = "e.g. `vm-{job}-{rank}`: lowercase letters, digits, `-`, and placeholders {job}, {rank}, {node}";
        let mut rest = s;
        let mut has_rank = false;
        let mut literal = String::new();
        while let Some(open) = rest.find('{') {
            literal.push_str(&rest[..open]);
            let close = rest[open..].find('}').ok_or_else(|| {
                ValueError::new(format!("unclosed `{{` in hostname pattern `{s}`")).hint(hint)
            })? + open;
            let name = &rest[open + 1..close];
            if !PLACEHOLDERS.contains(&name) {
                return Err(
                    ValueError::new(format!("unknown placeholder `{{{name}}}` in `{s}`"))
                        .hint(hint),
                );
            }
            has_rank |= name == "rank";
            literal.push('x');
            rest = &rest[close + 1..];
        }
        literal.push_str(rest);
        let ok = !literal.is_empty()
            && literal.len() <= 63
            && !literal.starts_with('-')
            && literal
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        if !ok {
            return Err(
                ValueError::new(format!("`{s}` is not a valid hostname pattern")).hint(hint),
            );
        }
        if !has_rank {
            return Err(
                ValueError::new(format!("hostname pattern `{s}` lacks `{{rank}}`"))
                    .hint("every VM of a job needs its own name; add `{rank}`"),
            );
        }
        Ok(HostnamePattern(s.to_string()))
    }

    pub fn render(&self, job: &str, rank: u32, node: &str) -> String {
        self.0
            .replace("{job}", job)
            .replace("{rank}", &rank.to_string())
            .replace("{node}", node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_prefix_is_component_wise() {
        let base = MirrorUrl::parse("http://mirror.example.org/debian/").unwrap();
        assert_eq!(base.as_str(), "http://mirror.example.org/debian");
        assert!(
            MirrorUrl::parse("http://mirror.example.org/debian")
                .unwrap()
                .is_within(&base)
        );
        assert!(
            !MirrorUrl::parse("http://mirror.example.org/debian-security")
                .unwrap()
                .is_within(&base)
        );
        assert!(MirrorUrl::parse("ftp://x").is_err());
    }

    #[test]
    fn hostname_patterns() {
        let p = HostnamePattern::parse("vm-{job}-{rank}").unwrap();
        assert_eq!(p.render("42", 3, "n1"), "vm-42-3");
        for bad in [
            "vm-{job}",
            "vm-{jbo}-{rank}",
            "VM-{rank}",
            "vm-{rank",
            "-{rank}",
        ] {
            assert!(HostnamePattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_names_hypervisors() {
        assert_eq!(FileMode::parse("0755").unwrap().bits(), 0o755);
        assert_eq!(FileMode::parse("644").unwrap().to_string(), "0644");
        assert!(FileMode::parse("0999").is_err());
        assert!(UnixName::parse("alice").is_ok());
        assert!(UnixName::parse("Alice").is_err());
        assert_eq!(
            Hypervisor::parse("qmeu").unwrap_err().hint.unwrap(),
            "did you mean `qemu`? known: qemu, libvirt, xen, palacios"
        );
    }
}
