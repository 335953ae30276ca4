//! The text form of one spec's `vse bench build` figures.

use super::Row;
use std::fmt;

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        writeln!(
            f,
            "{}: {} packages ({:.0} MiB); lock {:.1} s; build: first {:.1} s, full (no layer) {:.1} s, warm (layer) {:.1} s, no-op rebuild {:.3} s",
            r.spec,
            r.packages,
            r.download_mib,
            r.lock_s,
            r.first_build_s,
            r.full_build_s,
            r.warm_build_s,
            r.noop_rebuild_s
        )?;
        if let (Some(mm), Some(x), Some(xf)) = (
            r.mmdebstrap_warm_s,
            r.speedup_vs_mmdebstrap,
            r.mmdebstrap_vs_full,
        ) {
            writeln!(
                f,
                "  mmdebstrap (same set, warm cache, tarball): {mm:.1} s → vse is {x:.2}x faster warm, {xf:.2}x without a layer"
            )?;
        }
        if let Some(t) = r.launch_spec_cache_hit_s {
            writeln!(
                f,
                "  vse launch SPEC, unchanged spec (image store hit): {t:.3} s before the launch"
            )?;
        }
        if let (Some(t), Some(x)) = (r.add_one_package_s, r.add_one_package_vs_full) {
            writeln!(
                f,
                "  add one package: {t:.1} s = {:.0}% of the full build ({})",
                x * 100.0,
                r.add_one_package_root.as_deref().unwrap_or("?")
            )?;
        }
        if let (Some(t), Some(x)) = (r.change_one_file_s, r.change_one_file_vs_full) {
            writeln!(
                f,
                "  change one file: {t:.1} s = {:.0}% of the full build ({})",
                x * 100.0,
                r.change_one_file_root.as_deref().unwrap_or("?")
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

#[cfg(test)]
mod tests {
    use super::Row;

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
        assert!(text.contains("no-op rebuild 0.042 s"));
        assert_eq!(text.lines().count(), 1);
        r.add_one_package_s = Some(3.0);
        r.add_one_package_vs_full = Some(0.2);
        assert!(
            r.to_string()
                .contains("add one package: 3.0 s = 20% of the full build (?)")
        );
    }
}
