//! Durations written as `90s`, `30m`, `2h`, `1d` or sums like `1h30m`. A bare number is
//! refused (seconds? minutes?).

use super::ValueError;
use std::fmt;

/// A duration in whole seconds.
///
/// ```
/// use vsec::units::Seconds;
/// assert_eq!(Seconds::parse("1h30m").unwrap().get(), 5400);
/// assert_eq!(Seconds::parse("1d").unwrap(), Seconds::parse("24h").unwrap());
/// assert_eq!(Seconds::new(5400).to_string(), "1h30m");
/// // A bare number could be seconds or minutes: refused.
/// assert!(Seconds::parse("30").is_err());
/// assert!(Seconds::parse("2w").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Seconds(u64);

impl Seconds {
    pub const fn new(s: u64) -> Self {
        Seconds(s)
    }
    pub fn get(self) -> u64 {
        self.0
    }

    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let hint = "write e.g. `90s`, `30m`, `2h`, `1d` or `1h30m`";
        let bad = || ValueError::new(format!("`{s}` is not a duration")).hint(hint);
        let t = s.trim();
        if t.is_empty() {
            return Err(bad());
        }
        let mut total: u64 = 0;
        let mut num = String::new();
        for c in t.chars() {
            if c.is_ascii_digit() {
                num.push(c);
                continue;
            }
            let mult = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86400,
                _ => return Err(bad()),
            };
            let n: u64 = num.parse().map_err(|_| bad())?;
            num.clear();
            total = n
                .checked_mul(mult)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| ValueError::new(format!("duration `{s}` is too long")))?;
        }
        if !num.is_empty() {
            return Err(ValueError::new(format!("duration `{s}` has no unit")).hint(hint));
        }
        Ok(Seconds(total))
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mut rest, mut out) = (self.0, String::new());
        for (unit, mult) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
            if rest >= mult {
                out.push_str(&format!("{}{unit}", rest / mult));
                rest %= mult;
            }
        }
        if out.is_empty() {
            out.push_str("0s");
        }
        f.write_str(&out)
    }
}

impl fmt::Debug for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!(Seconds::parse("1h30m").unwrap().get(), 5400);
        assert_eq!(Seconds::parse("90s").unwrap().to_string(), "1m30s");
        for bad in ["", "30", "5 minutes", "1x", "99999999999999999999d"] {
            assert!(Seconds::parse(bad).is_err(), "{bad}");
        }
    }
}
