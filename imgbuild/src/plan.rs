//! What to build: the locked packages with where to fetch them and what they must hash to.

/// One locked `.deb`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlannedPackage {
    pub name: String,
    pub version: String,
    /// Full download URL (repository URL + pool path).
    pub url: String,
    pub size: u64,
    pub sha256: String,
    /// The package the spec named as its kernel.
    pub kernel: bool,
}

/// The builder's input, made from a lockfile by the CLI (or from apt by [`crate::aptplan`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BuildPlan {
    /// `sha256:<hex>` of the lockfile's bytes: the identity of the image's content.
    pub lock_hash: String,
    /// Seconds since the epoch stamped on every file (from the lock's release dates or
    /// `SOURCE_DATE_EPOCH`).
    pub epoch: u64,
    /// In install order (the lock's order: sorted by name).
    pub packages: Vec<PlannedPackage>,
}

impl BuildPlan {
    /// What the download cache must hold for this plan.
    pub fn wants(&self) -> Vec<crate::fetch::Want> {
        self.packages
            .iter()
            .map(|p| crate::fetch::Want {
                url: p.url.clone(),
                size: p.size,
                sha256: p.sha256.clone(),
                name: p.name.clone(),
            })
            .collect()
    }
}

/// Parses a Release `Date:` (`Sat, 10 May 2025 08:00:00 UTC`) into Unix seconds.
pub fn parse_release_date(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let p = if parts.first()?.ends_with(',') {
        &parts[1..]
    } else {
        &parts[..]
    };
    let day: u64 = p.first()?.parse().ok()?;
    let mon = *p.get(1)?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == mon)? as u64
        + 1;
    let year: i64 = p.get(2)?.parse().ok()?;
    let hms: Vec<u64> = p
        .get(3)?
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + (hms.first()? * 3600 + hms.get(1)? * 60 + hms.get(2)?) as i64;
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn release_dates_parse() {
        assert_eq!(
            super::parse_release_date("Sat, 10 May 2025 08:00:00 UTC"),
            Some(1_746_864_000)
        );
        assert_eq!(super::parse_release_date("garbage"), None);
    }
}
