//! One spec's build cases, each next to its own peer: only the full build has one that did
//! the same work (mmdebstrap of the same package set from its warm package cache, both
//! resolving), so only the full build is divided by a peer's time.

use super::Row;

/// One case of a spec's builds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Case {
    /// `full`, `warm`, `no-op`, `add-one-package`, `change-one-file`.
    pub case: &'static str,
    /// What vse ran.
    pub vse: &'static str,
    pub vse_s: f64,
    /// The peer of this case, or why it has none.
    pub peer: &'static str,
    pub peer_s: Option<f64>,
    /// `peer_s ÷ vse_s`, only where the peer did the same work.
    pub peer_vs_vse: Option<f64>,
    /// `vse_s ÷` the full build's (the incremental rebuilds' goal: ≤ 0.25).
    pub vs_full_build: Option<f64>,
}

const MMDEBSTRAP: &str =
    "mmdebstrap of the same package names (resolved by apt), its warm package cache, to a tarball";
const SAME_AS_FULL: &str =
    "mmdebstrap keeps no configured root: with its warm package cache this is its full run";

/// The cases measured in `r`.
pub fn of(r: &Row) -> Vec<Case> {
    let mm = r.mmdebstrap_warm_s;
    let mut v = vec![
        Case {
            case: "full",
            vse: "vse lock (warm index cache) + vse build --no-layers, warm download cache",
            vse_s: r.lock_and_full_build_s,
            peer: MMDEBSTRAP,
            peer_s: mm,
            peer_vs_vse: r.mmdebstrap_vs_lock_and_full,
            vs_full_build: None,
        },
        Case {
            case: "warm",
            vse: "vse build, the layer of the package set kept",
            vse_s: r.warm_build_s,
            peer: SAME_AS_FULL,
            peer_s: mm,
            peer_vs_vse: None,
            vs_full_build: None,
        },
        Case {
            case: "no-op",
            vse: "vse build of an unchanged lock over its image",
            vse_s: r.noop_rebuild_s,
            peer: "none: mmdebstrap always builds",
            peer_s: None,
            peer_vs_vse: None,
            vs_full_build: None,
        },
    ];
    let rebuilds = [
        (
            "add-one-package",
            "vse build of the image plus one package",
            r.add_one_package_s,
            r.add_one_package_vs_full,
        ),
        (
            "change-one-file",
            "vse build of the image with one spec file changed",
            r.change_one_file_s,
            r.change_one_file_vs_full,
        ),
    ];
    for (case, vse, s, x) in rebuilds {
        if let Some(vse_s) = s {
            v.push(Case {
                case,
                vse,
                vse_s,
                peer: SAME_AS_FULL,
                peer_s: mm,
                peer_vs_vse: None,
                vs_full_build: x,
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_full_build_is_divided_by_its_peer() {
        let r = Row {
            lock_and_full_build_s: 8.0,
            full_build_s: 7.9,
            warm_build_s: 2.0,
            noop_rebuild_s: 0.02,
            add_one_package_s: Some(2.5),
            add_one_package_vs_full: Some(2.5 / 7.9),
            mmdebstrap_warm_s: Some(36.0),
            mmdebstrap_vs_lock_and_full: Some(4.5),
            ..Row::default()
        };
        let c = of(&r);
        let names: Vec<&str> = c.iter().map(|c| c.case).collect();
        assert_eq!(names, ["full", "warm", "no-op", "add-one-package"]);
        assert_eq!((c[0].vse_s, c[0].peer_vs_vse), (8.0, Some(4.5)));
        // The warm build's peer is mmdebstrap's full run, shown but not divided.
        assert_eq!((c[1].peer_s, c[1].peer_vs_vse), (Some(36.0), None));
        assert!(c[1..].iter().all(|c| c.peer_vs_vse.is_none()));
        assert_eq!(c[2].peer_s, None);
        assert_eq!(c[3].vs_full_build, Some(2.5 / 7.9));
    }
}
