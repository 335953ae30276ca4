//! The site's policies hold without anyone passing `--policy`: they come from a root-owned
//! site directory (`VSE_SITE_DIR` here, which only root may set), a directory or file others
//! could write is refused, and an image is checked against them again at launch, so one
//! built before a rule forbade its package does not boot. No VM is booted: every launch here
//! ends at a refusal.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use support::vm::built_image;

/// A site directory (0755, root-owned as the tests run as root) holding `policy`.
fn site(policy: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(t.path().join("policy.d")).unwrap();
    std::fs::write(t.path().join("policy.d/10-site.policy.yaml"), policy).unwrap();
    t
}

const FORBID_TELNETD: &str = "version: 1\nname: site\npackages:\n  forbidden: [\"telnetd\"]\n";

/// A spec asking for telnetd, in a directory anyone can read.
fn spec_dir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        t.path().join("t.vse.yaml"),
        "version: 1\nname: t\nbase:\n  distribution: debian\n  suite: bookworm\npackages:\n  - telnetd\n",
    )
    .unwrap();
    t
}

fn check(site: Option<&Path>, spec: &Path) -> Output {
    let mut c = support::vse();
    c.arg("check").arg(spec).env_remove("VSE_SITE_DIR");
    if let Some(s) = site {
        c.env("VSE_SITE_DIR", s);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn is_root() -> bool {
    testkit::require(
        testkit::is_root(),
        "root",
        "site directories must be root-owned; run the tests as root (CI does)",
    )
}

#[test]
fn a_site_policy_refuses_a_spec_without_any_flag() {
    if !is_root() {
        return;
    }
    let (site, spec) = (site(FORBID_TELNETD), spec_dir());
    let spec = spec.path().join("t.vse.yaml");
    let o = check(Some(site.path()), &spec);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("packages: `telnetd` is forbidden")
            && text(&o).contains("policy.d/10-site.policy.yaml:4:"),
        "{}",
        text(&o)
    );
    // The same spec under an empty site passes: the site's file refused it.
    let empty = site_with_no_policy();
    let o = check(Some(empty.path()), &spec);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

fn site_with_no_policy() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

#[test]
fn a_site_others_can_write_is_refused() {
    if !is_root() {
        return;
    }
    let (site, spec) = (site(FORBID_TELNETD), spec_dir());
    let spec = spec.path().join("t.vse.yaml");
    std::fs::set_permissions(site.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = check(Some(site.path()), &spec);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("mode 0777"), "{}", text(&o));
    std::fs::set_permissions(site.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let policy = site.path().join("policy.d/10-site.policy.yaml");
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o646)).unwrap();
    let o = check(Some(site.path()), &spec);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("10-site.policy.yaml: owned by uid 0, mode 0646"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_user_cannot_choose_the_site_directory() {
    if !is_root() || !testkit::tool("setpriv") {
        return;
    }
    let spec = spec_dir();
    let mine = site_with_no_policy();
    // As nobody, with a site directory of their own that would allow telnetd.
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_vse"))
        .arg("check")
        .arg(spec.path().join("t.vse.yaml"))
        .env("VSE_SITE_DIR", mine.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("only root may choose the site directory (you are uid 65534)"),
        "{}",
        text(&o)
    );
}

/// An image built (by the shared fixture) before the site forbade one of its packages.
#[test]
fn an_image_built_before_a_rule_is_refused_at_launch() {
    if !is_root() {
        return;
    }
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let m = vse_image::manifest::Manifest::read(&img).expect("a built image's manifest");
    let pkgs = m.provenance.expect("a built image has provenance").packages;
    let p = pkgs
        .iter()
        .find(|p| p.name == "dash")
        .expect("dash is essential");
    let site = site(&format!(
        "version: 1\nname: site\npackages:\n  forbidden: [\"dash (<= {})\"]\n",
        p.version
    ));
    let run = tempfile::tempdir().unwrap();
    for args in [
        &["launch", "--allocation", "local:1"][..],
        &["run", "--run-dir", run.path().to_str().unwrap()][..],
    ] {
        let o = support::vse()
            .args(args)
            .arg(&img)
            .args(["--", "true"])
            .env("VSE_SITE_DIR", site.path())
            .env("VSE_RUN_DIR", run.path())
            .output()
            .unwrap();
        let err = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("refused by the site's policies")
                && err.contains("policy.d/10-site.policy.yaml:4:")
                && err.contains(&format!("holds package `dash` {}", p.version)),
            "{args:?}: {err}"
        );
    }
    assert!(
        std::fs::read_dir(run.path()).unwrap().next().is_none(),
        "nothing may start for a refused image"
    );
}

/// A lockfile names its policies: one made before the site had a policy is not built.
#[test]
fn a_lock_made_without_a_site_policy_is_not_built() {
    if !is_root() || !support::host_lists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("m.vse.yaml");
    std::fs::copy(support::specs().join("minimal.vse.yaml"), &spec).unwrap();
    let lock = dir.path().join("m.lock");
    let o = support::vse()
        .args(["lock", "--allow-expired", "-o"])
        .arg(&lock)
        .arg(&spec)
        .env_remove("VSE_SITE_DIR")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let site = site("version: 1\nname: site\n");
    let o = support::vse()
        .arg("build")
        .arg(&lock)
        .arg("-o")
        .arg(dir.path().join("img"))
        .env("VSE_SITE_DIR", site.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the lock was made without the site policy")
            && text(&o).contains("10-site.policy.yaml"),
        "{}",
        text(&o)
    );
    assert!(!dir.path().join("img").exists(), "nothing built");
}

/// `vse ARGS` as `t`, in a private mount namespace whose /etc/vse is `root`/vse (root-owned):
/// the site directory an ordinary user gets, without touching the machine's /etc.
fn vse_as_under_site(t: &testkit::unpriv::Tester, root: &Path, args: &[&str]) -> Output {
    t.command_under_site(root, env!("CARGO_BIN_EXE_vse"))
        .args(args)
        .output()
        .unwrap()
}

const TRUST_SITE: &str = "version: 1
name: site
repositories:
  mirror: http://127.0.0.1:9/debian
  keyrings: [/usr/share/keyrings/debian-archive-keyring.gpg]
network:
  ip_range: 10.20.0.0/16
  hostname: vm-{job}-{rank}
";

/// The attack: a user's `--policy` that swaps the site's archive keys, its mirror or its VM
/// hostnames. `vse check` and `vse lock`, run by the user under a site that sets them, refuse
/// each (exit 2, naming the field, the user's line and the site's line); the user's keyring is
/// never read (it does not exist: reading it would say so instead).
#[test]
fn a_user_policy_cannot_replace_the_site_s_trust_roots() {
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    if !testkit::tool("setpriv") || !testkit::tool("unshare") {
        return;
    }
    let etc = testkit::unpriv::Tester::etc_site(TRUST_SITE, &[]);
    let site_at = "/etc/vse/policy.d/10-site.policy.yaml";
    let home = t.scratch("trust");
    let d = home.path();
    t.write(
        &d.join("t.vse.yaml"),
        "version: 1\nname: t\nbase:\n  distribution: debian\n  suite: bookworm\n",
    );
    let spec = d.join("t.vse.yaml");
    let spec = spec.to_str().unwrap();
    let missing = d.join("mine.gpg");
    let cases = [
        (
            "keyrings",
            format!(
                "version: 1\nname: mine\nrepositories:\n  keyrings: [{}]\n",
                missing.display()
            ),
            "repositories.keyrings",
            ":4:13:",
            ":5:13:",
        ),
        (
            "mirror",
            "version: 1\nname: mine\nrepositories:\n  mirror: http://127.0.0.1:1/debian\n"
                .to_string(),
            "repositories.mirror",
            ":4:11:",
            ":4:11:",
        ),
        (
            "hostname",
            "version: 1\nname: mine\nnetwork:\n  ip_range: 10.20.1.0/24\n  hostname: login{rank}\n"
                .to_string(),
            "network.hostname",
            ":5:13:",
            ":8:13:",
        ),
    ];
    for (tag, text, field, user_at, site_line) in &cases {
        let user = d.join(format!("{tag}.policy.yaml"));
        t.write(&user, text);
        let user = user.to_str().unwrap();
        let lock = d.join(format!("{tag}.lock"));
        for args in [
            vec!["check", spec, "--policy", user],
            vec!["lock", spec, "--policy", user, "-o", lock.to_str().unwrap()],
        ] {
            let o = vse_as_under_site(&t, etc.path(), &args);
            let err = text_of(&o);
            assert_eq!(o.status.code(), Some(2), "{tag} {args:?}: {err}");
            assert!(
                err.contains(&format!("{user}{user_at} {field} = "))
                    && err.contains("may not change what an earlier policy set")
                    && err.contains(&format!("earlier policy {site_at}{site_line} {field} = "))
                    && err.contains("hint: "),
                "{tag} {args:?}: {err}"
            );
            assert!(
                !err.contains("cannot read keyring") && !err.contains("mine.gpg: No such"),
                "the user's keyring must not even be opened: {err}"
            );
            assert!(!lock.exists(), "no lock written");
        }
    }
    // Restating the site's value is fine: the user's policy may narrow, not swap.
    let same = d.join("same.policy.yaml");
    t.write(
        &same,
        "version: 1\nname: mine\nrepositories:\n  keyrings: [/usr/share/keyrings/debian-archive-keyring.gpg]\nnetwork:\n  ip_range: 10.20.1.0/24\n  hostname: vm-{job}-{rank}\n",
    );
    let o = vse_as_under_site(
        &t,
        etc.path(),
        &["check", spec, "--policy", same.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text_of(&o));

    // A site that leaves the keys to the default: the user still may not pick them.
    let etc =
        testkit::unpriv::Tester::etc_site("version: 1\nname: site\nlimits:\n  max_vcpus: 8\n", &[]);
    let user = d.join("keyrings.policy.yaml");
    let o = vse_as_under_site(
        &t,
        etc.path(),
        &["check", spec, "--policy", user.to_str().unwrap()],
    );
    let err = text_of(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("repositories.keyrings")
            && err.contains("a user's policy may not choose what the site trusts")
            && err.contains(&format!("site policy {site_at}:2:7:"))
            && !err.contains("cannot read keyring"),
        "{err}"
    );
}

fn text_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
