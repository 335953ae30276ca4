//! The solver on small synthetic repositories written as deb822 `Packages` text.

use std::path::Path;
use vsec::deb::PackagePattern;
use vsec::index::PackagesIndex;
use vsec::solve::{Provider, Root, SolveError, SolveOptions, Universe, solve};

fn universe(stanzas: &[&str]) -> Universe {
    let mut text = String::new();
    for (i, s) in stanzas.iter().enumerate() {
        let mut fields: Vec<String> = s.split(';').map(|f| f.trim().to_string()).collect();
        if !fields.iter().any(|f| f.starts_with("Architecture:")) {
            fields.push("Architecture: amd64".into());
        }
        text.push_str(&fields.join("\n"));
        text.push_str(&format!(
            "\nFilename: pool/{i}.deb\nSize: {i}\nSHA256: {:064x}\n\n",
            i
        ));
    }
    let idx = PackagesIndex::parse(Path::new("synthetic"), &text, 0).unwrap();
    Universe::new(idx, &vsec::deb::Arch::new("amd64").unwrap())
}

fn roots(names: &[&str]) -> Vec<Root> {
    names
        .iter()
        .map(|n| Root {
            group: vsec::deb::parse_relations(n).unwrap().remove(0),
            label: "requested".into(),
        })
        .collect()
}

fn chosen(u: &Universe, req: &[&str], opts: &SolveOptions) -> Result<Vec<String>, SolveError> {
    let sol = solve(u, &roots(req), opts)?;
    let mut v: Vec<String> = sol
        .chosen
        .iter()
        .map(|(id, _)| {
            let p = u.package(*id);
            format!("{}={}", p.name, p.version)
        })
        .collect();
    v.sort();
    Ok(v)
}

#[test]
fn prefers_highest_version_and_first_alternative() {
    let u = universe(&[
        "Package: app; Version: 1; Depends: liba | libb",
        "Package: liba; Version: 1",
        "Package: liba; Version: 2",
        "Package: libb; Version: 9",
    ]);
    assert_eq!(
        chosen(&u, &["app"], &SolveOptions::default()).unwrap(),
        ["app=1", "liba=2"]
    );
}

#[test]
fn backtracks_out_of_a_conflict_to_the_second_alternative() {
    // The first alternative's dependency conflicts with something already required:
    // a greedy walk fails, the search must go back and take `libb`.
    let u = universe(&[
        "Package: app; Version: 1; Depends: base, liba | libb",
        "Package: base; Version: 1",
        "Package: liba; Version: 1; Depends: helper",
        "Package: helper; Version: 1; Conflicts: base",
        "Package: libb; Version: 1",
    ]);
    let sol = solve(&u, &roots(&["app"]), &SolveOptions::default()).unwrap();
    assert!(sol.backtracks >= 1, "expected a backtrack");
    assert_eq!(
        chosen(&u, &["app"], &SolveOptions::default()).unwrap(),
        ["app=1", "base=1", "libb=1"]
    );
}

#[test]
fn picks_an_older_version_when_the_newest_breaks_something() {
    let u = universe(&[
        "Package: tool; Version: 1; Depends: lib",
        "Package: lib; Version: 2; Breaks: other (<< 5)",
        "Package: lib; Version: 1",
        "Package: other; Version: 4",
    ]);
    assert_eq!(
        chosen(&u, &["other", "tool"], &SolveOptions::default()).unwrap(),
        ["lib=1", "other=4", "tool=1"]
    );
}

#[test]
fn versioned_provides_and_virtual_conflicts() {
    let u = universe(&[
        "Package: app; Version: 1; Depends: mta, awk (>= 2)",
        "Package: exim; Version: 4; Provides: mta; Conflicts: mta",
        "Package: postfix; Version: 3; Provides: mta; Conflicts: mta",
        "Package: mawk; Version: 1; Provides: awk (= 1)",
        "Package: gawk; Version: 5; Provides: awk (= 5)",
        "Package: oldawk; Version: 1; Provides: awk",
    ]);
    let got = chosen(&u, &["app"], &SolveOptions::default()).unwrap();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.contains(&"gawk=5".to_string()), "{got:?}");
    // Two providers of a self-conflicting virtual package cannot coexist.
    let e = chosen(&u, &["exim", "postfix"], &SolveOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("postfix") && msg.contains("exim 4"), "{msg}");
}

#[test]
fn architecture_all_and_foreign_packages() {
    let u = universe(&[
        "Package: data; Version: 1; Architecture: all",
        "Package: data; Version: 2; Architecture: arm64",
        "Package: app; Version: 1; Depends: data, python3:any",
        "Package: python3; Version: 3; Multi-Arch: allowed",
    ]);
    assert_eq!(
        chosen(&u, &["app"], &SolveOptions::default()).unwrap(),
        ["app=1", "data=1", "python3=3"]
    );
}

#[test]
fn forbidden_dependency_names_the_chain_and_the_policy() {
    let u = universe(&[
        "Package: app; Version: 1; Depends: net",
        "Package: net; Version: 1; Depends: telnetd",
        "Package: telnetd; Version: 1",
    ]);
    let opts = SolveOptions {
        forbidden: vec![(
            PackagePattern::parse("telnet*").unwrap(),
            "policy site.yaml".into(),
        )],
        ..Default::default()
    };
    let e = chosen(&u, &["app"], &opts).unwrap_err();
    let SolveError::Unsatisfiable(un) = &e else {
        panic!("{e}")
    };
    assert!(un.is_forbidden(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("needed by app 1 (requested)"), "{msg}");
    assert!(msg.contains("net 1:") && msg.contains("telnetd"), "{msg}");
    assert!(msg.contains("policy site.yaml"), "{msg}");
}

#[test]
fn unsatisfiable_version_constraints_are_explained() {
    let u = universe(&[
        "Package: aa; Version: 1; Depends: cc (>= 2)",
        "Package: bb; Version: 1; Depends: cc (<< 2)",
        "Package: cc; Version: 1",
        "Package: cc; Version: 2",
    ]);
    let e = chosen(&u, &["aa", "bb"], &SolveOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("cc (<< 2)") && msg.contains("another version is chosen"),
        "{msg}"
    );
}

#[test]
fn recommends_are_soft() {
    let u = universe(&[
        "Package: app; Version: 1; Recommends: docs, missing-pkg",
        "Package: docs; Version: 1",
    ]);
    let on = SolveOptions {
        recommends: true,
        ..Default::default()
    };
    assert_eq!(chosen(&u, &["app"], &on).unwrap(), ["app=1", "docs=1"]);
    assert_eq!(
        chosen(&u, &["app"], &SolveOptions::default()).unwrap(),
        ["app=1"]
    );
}

#[test]
fn deterministic_across_runs() {
    let u = universe(&[
        "Package: app; Version: 1; Depends: xx | yy, zz",
        "Package: xx; Version: 1; Depends: zz (>= 2)",
        "Package: yy; Version: 1",
        "Package: zz; Version: 1",
        "Package: zz; Version: 2",
    ]);
    let a = chosen(&u, &["app"], &SolveOptions::default()).unwrap();
    for _ in 0..5 {
        assert_eq!(chosen(&u, &["app"], &SolveOptions::default()).unwrap(), a);
    }
}
