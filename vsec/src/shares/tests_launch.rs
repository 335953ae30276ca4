//! One job's shares: the defaults, the requests over them, a spec's shares end to end.

use super::tests::pol;
use super::tests_resolve::{arg, cx, p, rules, tree};
use super::*;
use std::path::Path;

#[test]
fn the_default_is_the_launch_directory_and_skipped_where_not_allowed() {
    let (_t, root) = tree(&["work", "home", "elsewhere"]);
    let got = resolve(&[], &ShareRules::default(), &cx(&root)).unwrap();
    let work = p(&root, "work");
    assert_eq!(
        got,
        [ResolvedShare {
            host: root.join("work"),
            guest: work.clone(),
            ro: false,
            default: true,
        }]
    );
    let r = rules(&format!(
        "  allowed: [{{path: {}}}]\n",
        p(&root, "elsewhere")
    ));
    assert_eq!(resolve(&[], &r, &cx(&root)).unwrap(), []);
    let r = rules(&format!("  forbidden: [{work}]\n"));
    assert_eq!(resolve(&[], &r, &cx(&root)).unwrap(), []);
    // Launched from home with both defaults: shared once.
    let r = rules("  default: [cwd, home]\n");
    let c = ShareContext {
        cwd: root.join("home"),
        home: root.join("home"),
    };
    assert_eq!(resolve(&[], &r, &c).unwrap().len(), 1);
    // Home refused is the admin's inconsistency: an error, not a silent skip.
    let r = rules(&format!(
        "  allowed: [{{path: {work}}}]\n  default: [cwd, home]\n"
    ));
    let e = resolve(&[], &r, &cx(&root)).unwrap_err().to_string();
    assert!(
        e.starts_with("shares.default (policy site.policy.yaml:5:18): cannot share"),
        "{e}"
    );
    // Unless a request takes its guest path: the default is then not judged at all.
    let home = p(&root, "home");
    let got = resolve(&[arg(&format!("{work}:{home}"))], &r, &cx(&root)).unwrap();
    let guests: Vec<_> = got.iter().map(|s| s.guest.as_str()).collect();
    assert_eq!(guests, [work.as_str(), home.as_str()]);
}

#[test]
fn a_request_replaces_the_default_for_its_guest_path_and_two_requests_clash() {
    let (_t, root) = tree(&["work", "home", "a", "b"]);
    let work = p(&root, "work");
    let got = resolve(
        &[arg(&format!("{}:{work}:ro", p(&root, "a")))],
        &ShareRules::default(),
        &cx(&root),
    )
    .unwrap();
    assert_eq!(
        got,
        [ResolvedShare {
            host: root.join("a"),
            guest: work,
            ro: true,
            default: false,
        }]
    );
    let two = [
        arg(&format!("{}:/d", p(&root, "a"))),
        arg(&format!("{}:/d", p(&root, "b"))),
    ];
    let e = resolve(&two, &ShareRules::default(), &cx(&root)).unwrap_err();
    assert!(matches!(e, ShareError::SameGuest { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("guest path /d is already shared by --share"),
        "{e}"
    );
    // Defaults first, then the requests in order.
    let got = resolve(
        &[arg(&format!("{}:/d", p(&root, "b")))],
        &ShareRules::default(),
        &cx(&root),
    )
    .unwrap();
    let guests: Vec<_> = got.iter().map(|s| s.guest.as_str()).collect();
    assert_eq!(guests, [p(&root, "work").as_str(), "/d"]);
}

#[test]
fn home_and_relative_paths_expand_and_missing_ones_say_so() {
    let (_t, root) = tree(&["work/sub", "home/data"]);
    std::fs::write(root.join("home/f"), "x").unwrap();
    let none = ShareRules {
        default: crate::env::Sourced::default(vec![]),
        ..ShareRules::default()
    };
    let got = resolve(
        &[arg("~/data"), arg("sub:/sub"), arg("~:/h")],
        &none,
        &cx(&root),
    )
    .unwrap();
    assert_eq!(got[0].host, root.join("home/data"));
    assert_eq!(got[0].guest, p(&root, "home/data"));
    assert_eq!(
        (got[1].host.clone(), got[1].guest.as_str()),
        (root.join("work/sub"), "/sub")
    );
    assert_eq!(got[2].host, root.join("home"));
    let e = resolve(&[arg("nope")], &none, &cx(&root)).unwrap_err();
    assert!(
        matches!(e, ShareError::Missing { .. }) && e.to_string().contains("hint: create it first"),
        "{e}"
    );
    let e = resolve(&[arg("~/f:/f")], &none, &cx(&root)).unwrap_err();
    assert!(
        e.to_string()
            .contains("not a directory; hint: share the directory holding it"),
        "{e}"
    );
}

#[test]
fn a_spec_share_is_checked_as_written_and_resolved_on_the_host() {
    let (_t, root) = tree(&["allowed/in", "work/sub", "home"]);
    let site = format!(
        "version: 1\nname: site\nshares:\n  allowed: [{{path: {}}}, {{path: {}, mode: ro}}]\n",
        p(&root, "allowed"),
        p(&root, "work")
    );
    let spec = |items: &str| {
        let text = format!(
            "version: 1\nname: s\nbase: {{distribution: debian, suite: bookworm}}\nshares:\n{items}"
        );
        crate::spec::parse_source(&crate::yaml::Source::from_bytes(
            "s.vse.yaml",
            Path::new("s.vse.yaml"),
            text.into_bytes(),
        ))
        .unwrap()
    };
    let policies = [pol("site.policy.yaml", &site)];
    let bad = spec(&format!("  - {}:/x\n", p(&root, "home")));
    let e = crate::merge::merge(&bad, &policies)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("s.vse.yaml:5:5: shares:") && e.contains("policy site.policy.yaml:4:12"),
        "{e}"
    );
    let good = spec(&format!(
        "  - {}:/in\n  - {{host: sub, guest: /sub, mode: ro}}\n",
        p(&root, "allowed/in")
    ));
    let env = crate::merge::merge(&good, &policies).unwrap();
    let got = resolve(
        &spec_requests(&env),
        &ShareRules::from_env(&env),
        &cx(&root),
    )
    .unwrap();
    let want = [
        ResolvedShare {
            host: root.join("work"),
            guest: p(&root, "work"),
            ro: true,
            default: true,
        },
        ResolvedShare {
            host: root.join("allowed/in"),
            guest: "/in".into(),
            ro: false,
            default: false,
        },
        ResolvedShare {
            host: root.join("work/sub"),
            guest: "/sub".into(),
            ro: true,
            default: false,
        },
    ];
    assert_eq!(got, want);
    let json = serde_json::to_string(&got[1]).unwrap();
    assert_eq!(
        serde_json::from_str::<ResolvedShare>(&json).unwrap(),
        got[1]
    );
    // The launch rules carry the same share rules either way.
    let launch = crate::launch::LaunchRules::from_env(&env).unwrap();
    assert_eq!(
        launch.shares,
        crate::launch::LaunchRules::from_policies(&policies)
            .unwrap()
            .shares
    );
}
