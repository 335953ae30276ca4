//! Validated newtypes for the strings a profile carries. They are checked once, on construction
//! and on deserialisation, so plugins can put them into command lines and config files unquoted.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why a value was rejected: what was expected, for the caller to wrap with the field name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NameError(pub String);

/// A VM name: 1–48 chars of `[A-Za-z0-9_.-]`, not starting with `.` or `-`. Short because it ends
/// up in unix socket paths (108 bytes max) and in libvirt/Xen domain names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VmName(String);

impl VmName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for VmName {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if s.is_empty() || s.len() > 48 {
            return Err(NameError(format!(
                "VM name {s:?} must be 1-48 characters long"
            )));
        }
        if s.starts_with(['.', '-']) || !s.chars().all(ok_char) {
            return Err(NameError(format!(
                "VM name {s:?} may only contain letters, digits, '_', '.', '-' and must not start with '.' or '-'"
            )));
        }
        Ok(VmName(s))
    }
}

impl FromStr for VmName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        VmName::try_from(s.to_owned())
    }
}

impl From<VmName> for String {
    fn from(n: VmName) -> String {
        n.0
    }
}

impl fmt::Display for VmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A unicast Ethernet MAC address, written `52:54:00:12:34:56`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MacAddr([u8; 6]);

impl MacAddr {
    pub const fn new(bytes: [u8; 6]) -> Self {
        MacAddr(bytes)
    }
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
    /// The `index`-th address after `base` (e.g. a policy range start), for one MAC per VM.
    pub fn offset(&self, index: u32) -> Option<MacAddr> {
        let mut v = 0u64;
        for b in self.0 {
            v = (v << 8) | u64::from(b);
        }
        let n = v.checked_add(u64::from(index))?;
        if n >> 48 != 0 {
            return None;
        }
        let b = n.to_be_bytes();
        Some(MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
}

impl FromStr for MacAddr {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let bad = || {
            NameError(format!(
                "MAC address {s:?} must look like 52:54:00:12:34:56"
            ))
        };
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut out = [0u8; 6];
        for (o, p) in out.iter_mut().zip(parts) {
            if p.len() != 2 {
                return Err(bad());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if out[0] & 1 == 1 {
            return Err(NameError(format!(
                "MAC address {s} is multicast; a NIC needs a unicast address"
            )));
        }
        Ok(MacAddr(out))
    }
}

impl TryFrom<String> for MacAddr {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        s.parse()
    }
}

impl From<MacAddr> for String {
    fn from(m: MacAddr) -> String {
        m.to_string()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// An RFC 1123 host name label (the guest's hostname): 1–63 of `[a-z0-9-]`, no leading/trailing `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Hostname(String);

impl Hostname {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Hostname {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && !s.starts_with('-')
            && !s.ends_with('-')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if ok {
            Ok(Hostname(s))
        } else {
            Err(NameError(format!(
                "hostname {s:?} must be 1-63 of lowercase letters, digits and '-', not starting or ending with '-'"
            )))
        }
    }
}

impl FromStr for Hostname {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        Hostname::try_from(s.to_owned())
    }
}

impl From<Hostname> for String {
    fn from(h: Hostname) -> String {
        h.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A set of host CPUs, written like `0-3,6`. Kept sorted and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CpuSet(Vec<usize>);

impl CpuSet {
    pub fn new(mut cpus: Vec<usize>) -> Result<Self, NameError> {
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            return Err(NameError("CPU set must not be empty".into()));
        }
        if cpus.iter().any(|&c| c >= 4096) {
            return Err(NameError("CPU numbers must be below 4096".into()));
        }
        Ok(CpuSet(cpus))
    }
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }
}

impl FromStr for CpuSet {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let bad = |p: &str| {
            NameError(format!(
                "CPU set {s:?}: {p:?} is not a CPU number or range like 0-3"
            ))
        };
        let mut cpus = Vec::new();
        for part in s.split(',').map(str::trim) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let a: usize = a.trim().parse().map_err(|_| bad(part))?;
                    let b: usize = b.trim().parse().map_err(|_| bad(part))?;
                    if a > b || b >= 4096 {
                        return Err(bad(part));
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(part.parse().map_err(|_| bad(part))?),
            }
        }
        CpuSet::new(cpus)
    }
}

impl TryFrom<String> for CpuSet {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        s.parse()
    }
}

impl From<CpuSet> for String {
    fn from(c: CpuSet) -> String {
        c.to_string()
    }
}

impl fmt::Display for CpuSet {
    /// Compact form with ranges, as taskset/libvirt/xl expect it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names() {
        assert!("job-12.vm_3".parse::<VmName>().is_ok());
        assert!("".parse::<VmName>().is_err());
        assert!("-x".parse::<VmName>().is_err());
        assert!("a/b".parse::<VmName>().is_err());
        assert!("x".repeat(49).parse::<VmName>().is_err());
    }

    #[test]
    fn macs() {
        let m: MacAddr = "52:54:00:00:00:ff".parse().unwrap();
        assert_eq!(m.offset(1).unwrap().to_string(), "52:54:00:00:01:00");
        assert!("01:00:00:00:00:00".parse::<MacAddr>().is_err());
        assert!("52:54:00:00:00".parse::<MacAddr>().is_err());
        assert!("52:54:00:00:00:zz".parse::<MacAddr>().is_err());
        assert!(
            MacAddr::new([0xff, 0xff, 0xff, 0xff, 0xff, 0xfe])
                .offset(2)
                .is_none()
        );
    }

    #[test]
    fn cpusets_round_trip() {
        let c: CpuSet = "3, 0-1,1,5-6".parse().unwrap();
        assert_eq!(c.cpus(), &[0, 1, 3, 5, 6]);
        assert_eq!(c.to_string(), "0-1,3,5-6");
        assert!("2-1".parse::<CpuSet>().is_err());
        assert!("".parse::<CpuSet>().is_err());
        assert!("a".parse::<CpuSet>().is_err());
    }

    #[test]
    fn hostnames() {
        assert!("node-01".parse::<Hostname>().is_ok());
        assert!("Node".parse::<Hostname>().is_err());
        assert!("a-".parse::<Hostname>().is_err());
    }
}
