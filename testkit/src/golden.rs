//! Golden files: expected output checked into the repository, compared byte for byte.
//!
//! `VSE_BLESS=1` (or the older `UPDATE_GOLDEN=1`) rewrites them from the actual output instead
//! of comparing, so that a deliberate change is one command and a reviewed diff. A blessed run
//! passes whatever the output is, so blessing is refused under CI (`CI` or
//! `VSE_REQUIRE_ALL=1` set): there the files are only ever compared.

use std::path::Path;

fn set(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Running under CI: `CI` (set by CI services) or `VSE_REQUIRE_ALL=1` (set by `.ci/run`).
pub fn under_ci() -> bool {
    set("CI") || crate::require_all()
}

/// Whether golden files are to be rewritten; panics when that is asked for under CI.
#[track_caller]
pub fn blessing() -> bool {
    let asked = set("VSE_BLESS") || set("UPDATE_GOLDEN");
    assert!(
        !(asked && under_ci()),
        "VSE_BLESS/UPDATE_GOLDEN is set under CI (CI or VSE_REQUIRE_ALL=1): golden files are \
         only compared there; bless locally and commit the reviewed diff"
    );
    asked
}

/// When blessing, writes `actual` to `path` and returns `None`. Otherwise returns a
/// description of the difference, or `None` when `path` holds exactly `actual`.
#[track_caller]
pub fn mismatch(path: &Path, actual: &str) -> Option<String> {
    if blessing() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        std::fs::write(path, actual)
            .unwrap_or_else(|e| panic!("cannot bless {}: {e}", path.display()));
        return None;
    }
    compare(path, actual)
}

/// The difference between `path` and `actual`, if any (never blesses).
fn compare(path: &Path, actual: &str) -> Option<String> {
    let expected = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return Some(format!(
                "{}: {e} (VSE_BLESS=1 creates it)\n--- got\n{actual}",
                path.display()
            ));
        }
    };
    (expected != actual).then(|| {
        format!(
            "{} differs from the actual output (first difference at line {})\n--- expected\n{expected}--- got\n{actual}",
            path.display(),
            first_difference(&expected, actual)
        )
    })
}

/// Asserts that `path` holds exactly `actual` (or blesses it, see [`blessing`]).
#[track_caller]
pub fn check(path: &Path, actual: &str) {
    if let Some(diff) = mismatch(path, actual) {
        panic!("{diff}\n(after checking the change, re-bless with VSE_BLESS=1)");
    }
}

fn first_difference(a: &str, b: &str) -> usize {
    let mut n = 1;
    let (mut x, mut y) = (a.lines(), b.lines());
    loop {
        match (x.next(), y.next()) {
            (Some(l), Some(r)) if l == r => n += 1,
            _ => return n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_byte_for_byte_and_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.txt");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(compare(&p, "a\nb\nc\n"), None);
        let d = compare(&p, "a\nB\nc\n").unwrap();
        assert!(d.contains("first difference at line 2"), "{d}");
        assert!(
            compare(&p, "a\nb\nc").is_some(),
            "a missing newline is a difference"
        );
        assert!(
            compare(&dir.path().join("none"), "x")
                .unwrap()
                .contains("VSE_BLESS=1")
        );
    }
}
