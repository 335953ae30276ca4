//! The written forms: `--share`, a spec's `shares:`, and what they leave in the environment.

use super::*;
use crate::policy::Policy;
use crate::yaml::Source;

pub(super) fn source(name: &str, text: &str) -> Source {
    Source::from_bytes(name, std::path::Path::new(name), text.as_bytes().to_vec())
}

pub(super) fn pol(name: &str, text: &str) -> Policy {
    crate::policy::parse_source(&source(name, text)).unwrap_or_else(|d| panic!("{name}: {d}"))
}

pub(super) const SPEC: &str =
    "version: 1\nname: s\nbase: {distribution: debian, suite: bookworm}\n";

pub(super) fn spec(shares: &str) -> Result<crate::spec::Spec, String> {
    crate::spec::parse_source(&source("s.vse.yaml", &format!("{SPEC}shares:\n{shares}")))
        .map_err(|d| d.to_string())
}

#[test]
fn share_args_parse_in_every_form() {
    let r = |s: &str| {
        let r = parse_share_arg(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (r.host, r.guest, r.ro)
    };
    let s = |x: &str| x.to_string();
    assert_eq!(r("data"), (s("data"), None, false));
    assert_eq!(r("data:ro"), (s("data"), None, true));
    assert_eq!(r("~/in:/in:ro"), (s("~/in"), Some(s("/in")), true));
    assert_eq!(
        r("/scratch/u:/data"),
        (s("/scratch/u"), Some(s("/data")), false)
    );
    assert_eq!(r("../up:/up:rw"), (s("../up"), Some(s("/up")), false));
    // A directory named like a mode is still a directory.
    assert_eq!(r("ro"), (s("ro"), None, false));
    let at = parse_share_arg("x:/data").unwrap().at;
    assert_eq!(at.to_string(), "--share x:/data");
}

#[test]
fn bad_share_args_are_refused_with_hints() {
    for (arg, want) in [
        ("", "empty host path"),
        ("x:", "empty guest path"),
        ("x:data", "`data` is not an absolute path"),
        ("x:/data:rx", "unknown mode `rx`"),
        ("a:/b:/c:ro", "too many `:`"),
        ("~bob/x", "only `~` (your home) is expanded"),
        ("x:/", "guest path `/`"),
        ("x:/etc/x", "under /etc"),
        ("x:/data/../etc", "contains `..`"),
        ("x:/data/", "empty component"),
    ] {
        let e = parse_share_arg(arg).expect_err(arg).to_string();
        assert!(e.starts_with(&format!("--share {arg}: ")), "{e}");
        assert!(e.contains(want) && e.contains("; hint: "), "{arg}: {e}");
    }
}

#[test]
fn guest_paths_outside_the_guest_system_only() {
    for ok in ["/data", "/home/u/x", "/scratch", "/opt/x", "/tmp/x", "/srv"] {
        assert!(guest_path(ok).is_ok(), "{ok}");
    }
    for bad in [
        "/",
        "/proc",
        "/sys/x",
        "/dev",
        "/run/x",
        "/etc",
        "/usr/local",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64/x",
        "/libx32",
        "/boot",
        "data",
    ] {
        let e = guest_path(bad).expect_err(bad);
        assert!(e.hint.is_some(), "{bad}");
    }
    assert!(
        (guest_path("/usr").unwrap_err().hint.unwrap()).contains("such as /data"),
        "the hint suggests a path"
    );
}

#[test]
fn spec_shares_keep_their_positions() {
    let s = spec("  - data:/data:ro\n  - {host: \"a:b\", guest: /ab}\n  - ~/x\n  - /scratch/u\n")
        .unwrap();
    let got: Vec<_> = (s.shares.iter())
        .map(|l| {
            let g = l.value.guest.as_ref().map(|g| g.to_string());
            (l.value.host.as_str(), g, l.value.ro, l.at.to_string())
        })
        .collect();
    let g = |x: &str| Some(x.to_string());
    assert_eq!(
        got,
        [
            ("data", g("/data"), true, "s.vse.yaml:5:5".to_string()),
            ("a:b", g("/ab"), false, "s.vse.yaml:6:5".to_string()),
            ("~/x", None, false, "s.vse.yaml:7:5".to_string()),
            ("/scratch/u", None, false, "s.vse.yaml:8:5".to_string()),
        ]
    );
    let env = crate::merge::merge(&s, &[]).unwrap();
    let reqs = spec_requests(&env);
    assert_eq!(reqs[1].at.to_string(), "s.vse.yaml:6:5");
    assert_eq!(reqs[0].guest.as_deref(), Some("/data"));
}

#[test]
fn spec_share_errors_name_their_line() {
    for (items, want) in [
        (
            "  - x:/etc\n",
            "s.vse.yaml:5:5: shares: guest path `/etc` is under /etc",
        ),
        (
            "  - /usr/share/data\n",
            "s.vse.yaml:5:5: shares: guest path `/usr/share/data`",
        ),
        (
            "  - {host: x, mode: rx}\n",
            "s.vse.yaml:5:21: shares.mode: unknown mode `rx`",
        ),
        (
            "  - {host: x, guest: data}\n",
            "s.vse.yaml:5:22: shares.guest: guest path:",
        ),
        ("  - {hots: x}\n", "unknown key `hots`"),
        ("  - {guest: /data}\n", "missing required key `host`"),
        (
            "  - a:/d\n  - b:/d\n",
            "s.vse.yaml:6:5: shares: guest path /d is already shared",
        ),
        (
            "  - /scratch\n  - b:/scratch\n",
            "first s.vse.yaml:5:5: shared here",
        ),
    ] {
        let e = spec(items).expect_err(items);
        assert!(e.contains(want), "{items}: want `{want}` in\n{e}");
        // A missing key is reported by the YAML layer, as for every format's struct.
        let hinted = !want.starts_with("missing");
        assert!(
            !hinted || e.contains("hint: "),
            "{items}: every error has a hint:\n{e}"
        );
    }
    let e = spec("  - /usr/share/data\n").unwrap_err();
    assert!(e.contains("`/usr/share/data:/data`"), "{e}");
}

#[test]
fn no_shares_leave_the_env_json_unchanged() {
    let s = crate::spec::parse_source(&source("s.vse.yaml", SPEC)).unwrap();
    let env = crate::merge::merge(&s, &[]).unwrap();
    let json = serde_json::to_value(&env).unwrap();
    assert!(
        json.get("shares").is_none() && json.get("share_policy").is_none(),
        "{json}"
    );
    let with = spec("  - /data\n").unwrap();
    let json = serde_json::to_value(crate::merge::merge(&with, &[]).unwrap()).unwrap();
    assert_eq!(json["shares"][0]["value"]["host"], "/data");
}
