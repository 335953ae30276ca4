//! Byte sizes. Units are explicit and case-sensitive: binary `KiB MiB GiB TiB` (powers of
//! 1024) and decimal `kB MB GB TB` (powers of 1000), or `B`. A bare number and the
//! one-letter forms `K M G T` are refused: `2G` means 2^31 to one tool and 2e9 to another.
//! Fractions are allowed when they come to a whole number of bytes (`1.5GiB`).

use super::ValueError;
use std::fmt;

/// A size in bytes, parsed from text with an explicit unit.
///
/// ```
/// use vsec::units::ByteSize;
/// let s = ByteSize::parse("1.5GiB").unwrap();
/// assert_eq!(s.bytes(), 3 << 29);
/// assert_eq!(s.mib(), 1536);
/// assert_eq!(ByteSize::parse("2GB").unwrap().bytes(), 2_000_000_000);
/// // Shown in the largest binary unit that is exact.
/// assert_eq!(s.to_string(), "1536MiB");
/// // Ambiguous or unitless sizes are refused with a hint.
/// let e = ByteSize::parse("2G").unwrap_err();
/// assert!(e.hint.unwrap().contains("`2GiB`"));
/// assert!(ByteSize::parse("512").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

impl ByteSize {
    pub const fn from_bytes(b: u64) -> Self {
        ByteSize(b)
    }
    pub const fn from_mib(m: u64) -> Self {
        ByteSize(m << 20)
    }
    pub fn bytes(self) -> u64 {
        self.0
    }
    pub fn mib(self) -> u64 {
        self.0 >> 20
    }

    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = (&t[..split], t[split..].trim_start());
        let example = "write e.g. `512MiB`, `2GiB` or `1.5GiB` (binary) or `2GB` (decimal)";
        if num.is_empty() {
            return Err(ValueError::new(format!("`{s}` is not a size")).hint(example));
        }
        if unit.is_empty() {
            return Err(ValueError::new(format!("size `{s}` has no unit")).hint(example));
        }
        let Some(&(_, mult)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            let hint = match unit {
                "K" | "k" | "M" | "m" | "G" | "g" | "T" | "t" => format!(
                    "`{unit}` is ambiguous: write `{num}{u}iB` (powers of 1024) or `{num}{u}B` (powers of 1000)",
                    u = unit.to_ascii_uppercase()
                ),
                _ if unit.ends_with('b') => {
                    format!("`{unit}` reads as bits; sizes are in bytes: {example}")
                }
                _ => format!("known units: B, KiB, MiB, GiB, TiB, kB, MB, GB, TB; {example}"),
            };
            return Err(ValueError::new(format!("unknown size unit `{unit}` in `{s}`")).hint(hint));
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() || frac.contains('.') || frac.len() > 12 || int.len() > 20 {
            return Err(ValueError::new(format!("`{num}` is not a number")).hint(example));
        }
        let too_big = || ValueError::new(format!("size `{s}` is too large"));
        let int_v: u128 = int.parse().map_err(|_| too_big())?;
        let frac_v: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| too_big())?
        };
        let scale = 10u128.pow(frac.len() as u32);
        let total = (int_v * scale + frac_v) * u128::from(mult);
        if !total.is_multiple_of(scale) {
            return Err(
                ValueError::new(format!("`{s}` is not a whole number of bytes"))
                    .hint("use a smaller unit, e.g. MiB instead of GiB"),
            );
        }
        u64::try_from(total / scale)
            .map(ByteSize)
            .map_err(|_| too_big())
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that represents the size exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, mult) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if self.0 >= mult && self.0.is_multiple_of(mult) {
                return write!(f, "{}{unit}", self.0 / mult);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl fmt::Debug for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Serialized as a plain byte count: unambiguous for every consumer.
impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(ByteSize::parse("2GiB").unwrap().bytes(), 2 << 30);
        assert_eq!(ByteSize::parse("512MiB").unwrap().bytes(), 512 << 20);
        assert_eq!(ByteSize::parse("1.5GiB").unwrap().bytes(), 3 << 29);
        assert_eq!(ByteSize::parse("2GB").unwrap().bytes(), 2_000_000_000);
        assert_eq!(ByteSize::parse("10 B").unwrap().bytes(), 10);
    }

    #[test]
    fn refuses_ambiguous_and_malformed() {
        for bad in [
            "2G",
            "2g",
            "2048",
            "2Gb",
            "GiB",
            "1.2.3GiB",
            "0.3B",
            "99999999999TiB",
            "2 parsecs",
            "",
        ] {
            let e = ByteSize::parse(bad).unwrap_err();
            assert!(
                e.hint.is_some() || e.message.contains("too large"),
                "{bad}: {e:?}"
            );
        }
        let e = ByteSize::parse("2G").unwrap_err();
        assert_eq!(
            e.hint.unwrap(),
            "`G` is ambiguous: write `2GiB` (powers of 1024) or `2GB` (powers of 1000)"
        );
    }

    #[test]
    fn displays_exact_binary_unit() {
        assert_eq!(ByteSize::parse("1.5GiB").unwrap().to_string(), "1536MiB");
        assert_eq!(ByteSize::parse("2GB").unwrap().to_string(), "1953125KiB");
        assert_eq!(ByteSize::parse("7B").unwrap().to_string(), "7B");
    }
}
