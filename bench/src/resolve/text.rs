//! The text form of `vse bench resolve`.

use super::{Process, ResolveReport};
use crate::measure::Measured;
use crate::stats::ms;
use std::fmt;

impl fmt::Display for ResolveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "indices: {} packages verified + parsed in {:.0} ms (signature, SHA256, lz4, deb822)",
            self.universe_packages,
            ms(self.parse)
        )?;
        writeln!(
            f,
            "{:<48} {:>5} {:>5} {:>6} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "request", "vse", "apt", "valid", "vse ms", "apt warm", "apt cold", "x warm", "x cold"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<48} {:>5} {:>5} {:>6} {:>9.1} {:>9.0} {:>9.0} {:>7.1} {:>7.1}",
                r.request,
                r.vse_packages,
                r.apt_packages,
                if r.valid { "yes" } else { "NO" },
                r.vse_resolve_ms,
                r.apt_warm_ms,
                r.apt_cold_ms,
                r.speedup_vs_apt_warm,
                r.speedup_vs_apt_cold
            )?;
        }
        writeln!(
            f,
            "x warm = apt-get -s with its caches built / vse resolve on the parsed index; x cold = apt-get -s building its caches / vse parse + resolve"
        )?;
        write!(f, "{}", self.process)
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self;
        let row = |f: &mut fmt::Formatter<'_>, what: &str, m: &Measured| {
            writeln!(
                f,
                "  {what:<34} {:>9.1} ms {:>9.1} MiB",
                m.wall_ms,
                m.max_rss_kib as f64 / 1024.0
            )
        };
        writeln!(
            f,
            "whole processes, {} ({} packages; apt: {}, {}):",
            p.request,
            p.packages,
            p.apt_packages,
            if p.same_packages {
                "same set"
            } else {
                "DIFFERENT set"
            }
        )?;
        row(f, "vse lock, no index cache", &p.vse_lock_no_cache)?;
        row(f, "vse lock, cold index cache", &p.vse_lock_cold)?;
        row(f, "vse lock, warm index cache", &p.vse_lock_warm)?;
        row(f, "apt-get install -s, cold", &p.apt_get_s_cold)?;
        row(f, "apt-get install -s, warm", &p.apt_get_s_warm)?;
        writeln!(
            f,
            "  warm vse lock is {:.1}x faster than warm apt-get -s (goal 10x) with {:.0}% of its peak memory (goal < 100%); cold is {:.2}x the no-cache time",
            p.warm_speedup_vs_apt_warm,
            p.warm_rss_vs_apt_warm * 100.0,
            p.cold_vs_no_cache
        )?;
        writeln!(
            f,
            "  (peak memory figures cannot go below {:.1} MiB, this benchmark's own size when it started them)",
            p.rss_floor_kib as f64 / 1024.0
        )
    }
}
