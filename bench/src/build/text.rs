//! The text form of one spec's `vse bench build` figures.

use super::{Case, Row};
use imgbuild::progress::Phase;
use std::fmt;

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        write!(
            f,
            "{}: {} packages ({:.0} MiB); lock {:.1} s; first build (fills the download cache) {:.1} s",
            r.spec, r.packages, r.download_mib, r.lock_s, r.first_build_s,
        )?;
        let save = (r.first_build_phases.iter()).find(|p| p.phase == Phase::SaveLayer);
        match save {
            Some(p) => writeln!(f, ", keeping its layer {:.2} s of it", p.seconds)?,
            None => writeln!(f)?,
        }
        for c in &r.cases {
            write_case(f, r, c)?;
        }
        if let Some(t) = r.launch_spec_cache_hit_s {
            writeln!(
                f,
                "  vse launch SPEC, unchanged spec (image store hit): {t:.3} s before the launch"
            )?;
        }
        if let (Some(acc), Some(o), Some(p), Some(pct)) = (
            &r.boot_accel,
            r.boot_to_agent_ready_ms,
            r.plain_boot_to_init_ms,
            r.boot_overhead_pct,
        ) {
            writeln!(
                f,
                "  boot ({acc}): vse to agent ready {o} ms, plain QEMU to init {p} ms → overhead {pct:+.1}%"
            )?;
        }
        if let (Some(u), Some(root), Some(user), Some(x), Some(same)) = (
            &r.rootless_user,
            r.root_no_layer_build_s,
            r.rootless_build_s,
            r.rootless_vs_root,
            r.rootless_identical,
        ) {
            writeln!(
                f,
                "  rootless (as {u}, warm download cache, no layer on either side): {user:.1} s vs root {root:.1} s = {:.0}%; images {}",
                x * 100.0,
                if same { "byte-identical" } else { "DIFFER" }
            )?;
        }
        Ok(())
    }
}

/// One case: vse's time, then its peer's (divided only where the peer did the same work).
fn write_case(f: &mut fmt::Formatter<'_>, r: &Row, c: &Case) -> fmt::Result {
    write!(f, "  {}: {:.3} s ({})", c.case, c.vse_s, c.vse)?;
    match c.case {
        "full" => write!(f, "; build alone {:.2} s{}", r.full_build_s, phases(r))?,
        "add-one-package" => root(f, r.add_one_package_root.as_deref())?,
        "change-one-file" => root(f, r.change_one_file_root.as_deref())?,
        _ => {}
    }
    if let Some(x) = c.vs_full_build {
        write!(f, " = {:.0}% of the full build", x * 100.0)?;
    }
    match (c.peer_s, c.peer_vs_vse) {
        (Some(p), Some(x)) => writeln!(f, "\n    vs {}: {p:.1} s; ÷ vse = {x:.2}", c.peer),
        (Some(p), None) => writeln!(f, "\n    peer: {} ({p:.1} s)", c.peer),
        (None, _) => writeln!(f, "\n    peer: {}", c.peer),
    }
}

fn root(f: &mut fmt::Formatter<'_>, how: Option<&str>) -> fmt::Result {
    write!(f, "; root: {}", how.unwrap_or("?"))
}

/// ` (fetch 0.05 s, unpack 2.10 s, …)`: where the full build's time went.
fn phases(r: &Row) -> String {
    if r.full_build_phases.is_empty() {
        return String::new();
    }
    let each: Vec<String> = (r.full_build_phases.iter())
        .map(|p| format!("{} {:.2} s", phase_name(p.phase), p.seconds))
        .collect();
    format!(" ({})", each.join(", "))
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Fetch => "fetch",
        Phase::Unpack => "unpack",
        Phase::Configure => "configure",
        Phase::SaveLayer => "save layer",
        Phase::Customize => "customize",
        Phase::Initramfs => "initramfs",
        Phase::RootDisk => "root disk",
        Phase::Extras => "extras",
        Phase::Manifest => "hash + manifest",
        Phase::Verify => "verify",
        Phase::Layers => "layers",
    }
}

#[cfg(test)]
mod tests {
    use super::Row;
    use imgbuild::progress::{Phase, PhaseTime};

    #[test]
    fn optional_figures_appear_only_when_measured() {
        let mut r = Row {
            spec: "specs/minimal.vse.yaml".into(),
            packages: 120,
            download_mib: 80.4,
            lock_s: 1.3,
            noop_rebuild_s: 0.0421,
            ..Row::default()
        };
        let text = r.to_string();
        assert!(text.starts_with("specs/minimal.vse.yaml: 120 packages (80 MiB); lock 1.3 s"));
        assert_eq!(text.lines().count(), 1);
        r.add_one_package_s = Some(3.0);
        r.add_one_package_vs_full = Some(0.2);
        r.cases = super::super::cases::of(&r);
        let text = r.to_string();
        assert!(text.contains("  no-op: 0.042 s"), "{text}");
        assert!(
            text.contains("  add-one-package: 3.000 s (vse build of the image plus one package); root: ? = 20% of the full build"),
            "{text}"
        );
        assert!(!text.contains("÷ vse"), "no peer measured: {text}");
    }

    #[test]
    fn the_full_build_shows_its_phases_and_only_it_is_divided_by_mmdebstrap() {
        let mut r = Row {
            spec: "s".into(),
            lock_and_full_build_s: 8.0,
            full_build_s: 7.9,
            full_build_phases: vec![
                PhaseTime {
                    phase: Phase::Unpack,
                    seconds: 2.5,
                },
                PhaseTime {
                    phase: Phase::Manifest,
                    seconds: 0.25,
                },
            ],
            warm_build_s: 2.0,
            mmdebstrap_warm_s: Some(36.0),
            mmdebstrap_vs_lock_and_full: Some(4.5),
            ..Row::default()
        };
        r.cases = super::super::cases::of(&r);
        let text = r.to_string();
        assert!(
            text.contains("build alone 7.90 s (unpack 2.50 s, hash + manifest 0.25 s)"),
            "{text}"
        );
        assert_eq!(text.matches("÷ vse").count(), 1, "{text}");
        assert!(text.contains(": 36.0 s; ÷ vse = 4.50"), "{text}");
        assert!(
            text.contains("peer: mmdebstrap keeps no configured root: with its warm package cache this is its full run (36.0 s)"),
            "{text}"
        );
    }
}
