//! A policy's `shares:` as written, how a stack of them combines, and `vse check`.

use super::tests::{pol, source, spec};
use super::*;

#[test]
fn policy_shares_parse() {
    let p = pol(
        "site.policy.yaml",
        "version: 1\nname: site\nshares:\n  allowed: [{path: /home}, {path: /scratch, mode: ro}]\n  default: [cwd, home:ro, /scratch]\n  forbidden: [/home/secret]\n",
    );
    let rules = ShareRules::from_policies(&[p]).unwrap();
    let a = rules.allowed.as_ref().unwrap();
    assert_eq!(a.value[1].value.path.as_str(), "/scratch");
    assert!(a.value[1].value.ro && !a.value[0].value.ro);
    assert_eq!(a.value[1].from.to_string(), "policy site.policy.yaml:4:28");
    let d: Vec<_> = rules
        .default
        .value
        .iter()
        .map(|d| d.value.to_string())
        .collect();
    assert_eq!(d, ["cwd", "home:ro", "/scratch"]);
    assert_eq!(
        rules.forbidden[0].from.to_string(),
        "policy site.policy.yaml:6:15"
    );
    for (shares, want) in [
        (
            "  allowed: [{path: home}]\n",
            "site.policy.yaml:4:20: shares.allowed.path",
        ),
        (
            "  allowed: [{path: /h, mode: r}]\n",
            "shares.allowed.mode: unknown mode `r`",
        ),
        ("  allowed: [{path: /h, mod: ro}]\n", "unknown key `mod`"),
        (
            "  default: [pwd]\n",
            "shares.default: `pwd` is not a default share",
        ),
        ("  default: [/etc/site]\n", "under /etc"),
        (
            "  forbidden: [secret]\n",
            "shares.forbidden: `secret` is not an absolute path",
        ),
    ] {
        let text = format!("version: 1\nname: site\nshares:\n{shares}");
        let e = crate::policy::parse_source(&source("site.policy.yaml", &text))
            .expect_err(shares)
            .to_string();
        assert!(
            e.contains(want) && e.contains("hint: "),
            "want `{want}` in\n{e}"
        );
    }
}

fn stacked(site: &str, later: &str) -> Result<ShareRules, String> {
    let site = pol(
        "site.policy.yaml",
        &format!("version: 1\nname: site\nshares:\n{site}"),
    );
    let later = pol(
        "part.policy.yaml",
        &format!("version: 1\nname: part\nshares:\n{later}"),
    );
    ShareRules::from_policies(&[site, later]).map_err(|d| d.to_string())
}

fn allowed(r: &ShareRules) -> Vec<String> {
    let a = r.allowed.as_ref().expect("allowed");
    (a.value.iter())
        .map(|e| format!("{}{}", e.value.path, if e.value.ro { ":ro" } else { "" }))
        .collect()
}

#[test]
fn a_later_policy_narrows_allowed_and_refuses_widening() {
    let site = "  allowed: [{path: /home}, {path: /scratch, mode: ro}]\n";
    let r = stacked(
        site,
        "  allowed: [{path: /home/u}, {path: /scratch/x, mode: ro}]\n",
    )
    .unwrap();
    assert_eq!(allowed(&r), ["/home/u", "/scratch/x:ro"]);
    let e = stacked(site, "  allowed: [{path: /opt}]\n").unwrap_err();
    assert!(
        e.contains(
            "part.policy.yaml:4:13: shares.allowed: /opt is not allowed by an earlier policy"
        ) && e.contains(
            "earlier policy site.policy.yaml:4:12: shares.allowed = [/home, /scratch:ro]"
        ),
        "{e}"
    );
    // Component-wise: /homes is not under /home.
    assert!(stacked(site, "  allowed: [{path: /homes}]\n").is_err());
    let e = stacked(site, "  allowed: [{path: /scratch/x}]\n").unwrap_err();
    assert!(
        e.contains("part.policy.yaml:4:13: shares.allowed: /scratch/x read-write widens")
            && e.contains("earlier policy site.policy.yaml:4:28: shares.allowed: /scratch:ro")
            && e.contains("add `mode: ro`"),
        "{e}"
    );
    // An earlier read-only entry inside a later read-write one still holds.
    let r = stacked(
        "  allowed: [{path: /home}, {path: /home/shared, mode: ro}]\n",
        "  allowed: [{path: /home}]\n",
    )
    .unwrap();
    assert_eq!(allowed(&r), ["/home", "/home/shared:ro"]);
    // Nothing said before: a later policy sets it.
    let r = stacked("  forbidden: [/x]\n", "  allowed: [{path: /opt}]\n").unwrap();
    assert_eq!(allowed(&r), ["/opt"]);
}

#[test]
fn forbidden_accumulates_and_default_is_replaced() {
    let r = stacked(
        "  forbidden: [/a]\n  default: [cwd, home]\n",
        "  forbidden: [/b]\n  default: [/scratch:ro]\n",
    )
    .unwrap();
    let f: Vec<_> = r.forbidden.iter().map(|f| f.value.to_string()).collect();
    assert_eq!(f, ["/a", "/b"]);
    let d: Vec<_> = r
        .default
        .value
        .iter()
        .map(|d| d.value.to_string())
        .collect();
    assert_eq!(d, ["/scratch:ro"]);
    assert!(r.default.from.to_string().contains("part.policy.yaml:5"));
    let r = stacked("  default: [home]\n", "  forbidden: [/b]\n").unwrap();
    assert_eq!(r.default.value[0].value.to_string(), "home");
}

#[test]
fn a_default_must_be_allowed_by_the_stack() {
    let e = stacked("  allowed: [{path: /home}]\n", "  default: [/scratch]\n").unwrap_err();
    assert!(
        e.contains("part.policy.yaml:4:13: shares.default: /scratch is under no allowed directory")
            && e.contains("policy site.policy.yaml:4:12"),
        "{e}"
    );
    let e = stacked("  default: [/home/x]\n", "  forbidden: [/home]\n").unwrap_err();
    assert!(
        e.contains("site.policy.yaml:4:13: shares.default: /home/x is forbidden")
            && e.contains("policy part.policy.yaml:4:15: shares.forbidden: /home"),
        "{e}"
    );
    // A read-write default under a read-only entry is shared read-only, not refused.
    assert!(stacked("  allowed: [{path: /s, mode: ro}]\n", "  default: [/s/x]\n").is_ok());
}

#[test]
fn an_unset_policy_allows_anything_and_shares_cwd() {
    let r = ShareRules::from_policies(&[]).unwrap();
    assert_eq!(r, ShareRules::default());
    assert!(r.allowed.is_none() && r.forbidden.is_empty());
    let d: Vec<_> = r
        .default
        .value
        .iter()
        .map(|d| d.value.to_string())
        .collect();
    assert_eq!(d, ["cwd"]);
    assert!(r.default.is_default());
}

#[test]
fn check_refuses_absolute_spec_shares_the_policy_refuses() {
    let site = pol(
        "site.policy.yaml",
        "version: 1\nname: site\nshares:\n  allowed: [{path: /home}, {path: /scratch, mode: ro}]\n  forbidden: [/home/secret]\n",
    );
    let s = spec("  - /opt/x\n  - /home/secret/k\n  - /scratch/y\n  - /home/ok/../../opt\n  - rel\n  - ~/x\n  - /scratch/z:ro\n").unwrap();
    let e = crate::merge::merge(&s, std::slice::from_ref(&site))
        .unwrap_err()
        .to_string();
    for want in [
        "s.vse.yaml:5:5: shares: /opt/x is under no allowed directory\n  policy site.policy.yaml:4:12: shares.allowed = [/home, /scratch:ro]",
        "s.vse.yaml:6:5: shares: /home/secret/k is under /home/secret, which the policy forbids\n  policy site.policy.yaml:5:15",
        "s.vse.yaml:7:5: shares: /scratch/y is asked read-write, but the policy allows /scratch read-only\n  policy site.policy.yaml:4:28",
        "ask for it read-only",
        "s.vse.yaml:8:5: shares: /opt is under no allowed directory",
    ] {
        assert!(e.contains(want), "want `{want}` in\n{e}");
    }
    assert_eq!(
        e.matches("hint: ").count(),
        4,
        "relative, `~` and :ro pass:\n{e}"
    );
    let ok = spec("  - /home/u\n  - /scratch/z:ro\n").unwrap();
    let env = crate::merge::merge(&ok, &[site]).unwrap();
    assert!(check_spec(&env, &ShareRules::from_env(&env)).is_empty());
}
