//! Resolution on the host, against real directories: symlinks, `..`, permissions, modes.

use super::tests::pol;
use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

/// A scratch tree, by its canonical path (the rules compare canonical paths).
pub(super) fn tree(dirs: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    (t, root)
}

pub(super) fn rules(shares: &str) -> ShareRules {
    let text = format!("version: 1\nname: site\nshares:\n{shares}");
    ShareRules::from_policies(&[pol("site.policy.yaml", &text)]).unwrap()
}

pub(super) fn cx(root: &Path) -> ShareContext {
    ShareContext {
        cwd: root.join("work"),
        home: root.join("home"),
    }
}

pub(super) fn arg(s: &str) -> ShareRequest {
    parse_share_arg(s).unwrap()
}

pub(super) fn one(root: &Path, r: &ShareRules, a: &str) -> Result<ResolvedShare, ShareError> {
    let rules = ShareRules {
        default: crate::env::Sourced::default(vec![]),
        ..r.clone()
    };
    resolve(&[arg(a)], &rules, &cx(root)).map(|mut v| v.remove(0))
}

pub(super) fn p(root: &Path, rel: &str) -> String {
    root.join(rel).display().to_string()
}

#[test]
fn a_symlink_inside_an_allowed_prefix_cannot_lead_out() {
    let (_t, root) = tree(&["allowed/ok", "outside", "work", "home"]);
    symlink(root.join("outside"), root.join("allowed/link")).unwrap();
    let r = rules(&format!("  allowed: [{{path: {}}}]\n", p(&root, "allowed")));
    let ok = one(&root, &r, &p(&root, "allowed/ok")).unwrap();
    assert_eq!((ok.host, ok.ro), (root.join("allowed/ok"), false));
    let e = one(&root, &r, &format!("{}:/data", p(&root, "allowed/link"))).unwrap_err();
    assert!(matches!(e, ShareError::NotAllowed { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.starts_with(&format!(
            "--share {}:/data: cannot share {}:",
            p(&root, "allowed/link"),
            p(&root, "outside")
        )) && e.contains("(policy site.policy.yaml:4:12: [")
            && e.contains("hint: share a directory under one of them"),
        "{e}"
    );
}

#[test]
fn dot_dot_cannot_escape_an_allowed_prefix() {
    let (_t, root) = tree(&["allowed/a", "outside", "work", "home"]);
    let r = rules(&format!("  allowed: [{{path: {}}}]\n", p(&root, "allowed")));
    let e = one(
        &root,
        &r,
        &format!("{}:/d", p(&root, "allowed/a/../../outside")),
    )
    .unwrap_err();
    assert!(matches!(e, ShareError::NotAllowed { .. }), "{e}");
    // Relative to the launch directory, the same.
    std::fs::create_dir_all(root.join("allowed/work")).unwrap();
    let c = ShareContext {
        cwd: root.join("allowed/work"),
        home: root.join("home"),
    };
    let rs = ShareRules {
        default: crate::env::Sourced::default(vec![]),
        ..r
    };
    let e = resolve(&[arg("../../outside:/d")], &rs, &c).unwrap_err();
    assert!(matches!(e, ShareError::NotAllowed { .. }), "{e}");
    let ok = resolve(&[arg("../a:/d")], &rs, &c).unwrap();
    assert_eq!(ok[0].host, root.join("allowed/a"));
}

#[test]
fn an_unreadable_directory_is_refused() {
    let (_t, root) = tree(&["locked/inner", "work", "home"]);
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let r = ShareRules::default();
    let got = one(&root, &r, &format!("{}:/d", p(&root, "locked")));
    let inner = one(&root, &r, &format!("{}:/d", p(&root, "locked/inner")));
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("running as root, which reads every directory: the refusal is not checked");
        return;
    }
    for e in [got.unwrap_err(), inner.unwrap_err()] {
        assert!(matches!(e, ShareError::Unreadable { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("hint: share a directory you can list and enter"),
            "{e}"
        );
    }
}

#[test]
fn a_rw_request_under_a_ro_entry_is_refused_but_a_default_is_downgraded() {
    let (_t, root) = tree(&["ro/d", "ro/e", "work", "home"]);
    let r = rules(&format!(
        "  allowed: [{{path: {}, mode: ro}}, {{path: {}}}]\n  default: [{}]\n",
        p(&root, "ro"),
        p(&root, "work"),
        p(&root, "ro/d")
    ));
    let e = one(&root, &r, &format!("{}:/e", p(&root, "ro/e"))).unwrap_err();
    assert!(matches!(e, ShareError::ReadOnly { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("read-only (policy site.policy.yaml:4:13); hint: ask for it read-only"),
        "{e}"
    );
    assert!(
        one(&root, &r, &format!("{}:/e:ro", p(&root, "ro/e")))
            .unwrap()
            .ro
    );
    let got = resolve(&[], &r, &cx(&root)).unwrap();
    assert_eq!(
        got,
        [ResolvedShare {
            host: root.join("ro/d"),
            guest: p(&root, "ro/d"),
            ro: true,
            default: true,
        }]
    );
}

#[test]
fn forbidden_wins_over_allowed() {
    let (_t, root) = tree(&["top/secret/x", "top/hidden", "top/ok", "work", "home"]);
    symlink(root.join("top/hidden"), root.join("top/alias")).unwrap();
    let r = rules(&format!(
        "  allowed: [{{path: {}}}]\n  forbidden: [{}, {}]\n",
        p(&root, "top"),
        p(&root, "top/secret"),
        p(&root, "top/alias")
    ));
    let e = one(&root, &r, &format!("{}:/d", p(&root, "top/secret/x"))).unwrap_err();
    assert!(matches!(e, ShareError::Forbidden { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("which shares.forbidden refuses (policy site.policy.yaml:5:15)"),
        "{e}"
    );
    // A forbidden prefix that is a symlink also catches its target.
    let e = one(&root, &r, &format!("{}:/d", p(&root, "top/hidden"))).unwrap_err();
    assert!(matches!(e, ShareError::Forbidden { .. }), "{e}");
    assert!(one(&root, &r, &format!("{}:/d", p(&root, "top/ok"))).is_ok());
}

#[test]
fn an_allowed_prefix_that_is_a_symlink_is_compared_canonically() {
    let (_t, root) = tree(&["real/x", "work", "home"]);
    symlink(root.join("real"), root.join("alias")).unwrap();
    let r = rules(&format!(
        "  allowed: [{{path: {}, mode: ro}}]\n",
        p(&root, "alias")
    ));
    for a in [p(&root, "real/x"), p(&root, "alias/x")] {
        let s = one(&root, &r, &format!("{a}:/x:ro")).unwrap();
        assert_eq!((s.host, s.ro), (root.join("real/x"), true));
    }
    // Component-wise: `realm` is not under `real`.
    std::fs::create_dir_all(root.join("realm")).unwrap();
    assert!(one(&root, &r, &format!("{}:/x:ro", p(&root, "realm"))).is_err());
}
