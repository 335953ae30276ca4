//! What `vse build LOCK` trusts. Nothing in a lock but the names of what to install: run as
//! the ordinary account (the attacker writes the lock), each forged lock exits 2 naming the
//! package and why, before anything is fetched or built. And no build cache another user can
//! change: a root build refuses a `VSE_CACHE` the attacker owns (with a `.deb` planted in
//! it), an ordinary build one owned by another user, group-writable, or under a directory
//! another user may change.
//!
//! The lock is `vse lock` of the minimal example under the example site policy, against the
//! host's apt lists (`--allow-expired`, as in `tests/lock_cli.rs`). No network: a proxy that
//! does not exist takes every request but those to the attacker's mirror on 127.0.0.1.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use support::specs;
use testkit::unpriv::Tester;
use vsec::deb::{DebVersion, PackageName};
use vsec::lock::{LockedPackage, LockedRepository, Lockfile};

const VSE: &str = env!("CARGO_BIN_EXE_vse");

/// The attacker's mirror: answers every request with `body` and counts the requests.
fn forged_mirror(body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/debian", l.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body);
        }
    });
    (url, hits)
}

fn as_tester(t: &Tester, args: &[&str], dir: &Path) -> Output {
    t.command(VSE)
        .args(args)
        .current_dir(dir)
        // Nothing leaves the machine even if a check is missing.
        .env("http_proxy", "http://127.0.0.1:9")
        .env("https_proxy", "http://127.0.0.1:9")
        .env("no_proxy", "127.0.0.1")
        .output()
        .expect("vse runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `telnetd` (forbidden by the example site policy) as apt's lists have it: its version,
/// file, size and SHA256, and the archive it comes from.
fn telnetd() -> (LockedPackage, String) {
    let show = std::process::Command::new("apt-cache")
        .args(["show", "--no-all-versions", "telnetd"])
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout).into_owned();
    let field = |k: &str| {
        show.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}: ")))
            .unwrap_or_else(|| panic!("apt-cache show telnetd: no {k}:\n{show}"))
            .to_string()
    };
    let version = field("Version");
    let madison = std::process::Command::new("apt-cache")
        .args(["madison", "telnetd"])
        .output()
        .unwrap();
    let madison = String::from_utf8_lossy(&madison.stdout).into_owned();
    let url = madison
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|f| f.len() == 3 && f[1] == version)
        .and_then(|f| f[2].split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| panic!("apt-cache madison telnetd:\n{madison}"));
    let p = LockedPackage {
        name: PackageName::new("telnetd").unwrap(),
        version: DebVersion::parse(&version).unwrap(),
        architecture: vsec::deb::Arch::new(&field("Architecture")).unwrap(),
        filename: field("Filename"),
        size: field("Size").parse().unwrap(),
        sha256: field("SHA256"),
        repository: 0,
        reason: vsec::lock::Reason::Requested,
    };
    (p, url)
}

#[test]
fn forged_locks_exit_2_naming_the_package_before_anything_is_fetched() {
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    if !support::host_lists() {
        return;
    }
    // Arrange: the attacker's own lock of the minimal example, as `vse lock` writes it.
    let scratch = t.scratch("lockv");
    let dir = scratch.path();
    for f in ["minimal.vse.yaml", "site.policy.yaml"] {
        t.write(&dir.join(f), std::fs::read(specs().join(f)).unwrap());
    }
    let o = as_tester(
        &t,
        &[
            "lock",
            "--allow-expired",
            "--quiet",
            "minimal.vse.yaml",
            "--policy",
            "site.policy.yaml",
            "-o",
            "good.lock",
        ],
        dir,
    );
    assert!(o.status.success(), "vse lock: {}", text(&o));
    let good = Lockfile::read(&dir.join("good.lock")).unwrap();
    let at = |l: &Lockfile, n: &str| {
        l.packages
            .iter()
            .position(|p| p.name.as_str() == n)
            .unwrap_or_else(|| panic!("{n} not in the lock"))
    };
    let forged_deb = b"!<arch>\nforged by hand\n".to_vec();
    let forged_sha = imgbuild::fetch::sha256_hex(&forged_deb);
    let (mirror, hits) = forged_mirror(forged_deb.clone());
    let (telnetd, telnetd_url) = telnetd();
    let repo_of = |l: &Lockfile, url: &str| {
        l.repositories
            .iter()
            .position(|r| r.url.trim_end_matches('/') == url.trim_end_matches('/'))
            .unwrap_or_else(|| panic!("no repository {url} in the lock"))
    };

    type Edit = Box<dyn Fn(&mut Lockfile)>;
    let cases: Vec<(&str, Edit, Vec<&str>, &[&str])> = vec![
        (
            "another real .deb (its own size and SHA256)",
            Box::new(move |l: &mut Lockfile| {
                let (b, other) = (at(l, "busybox-static"), at(l, "libnuma1"));
                let o = l.packages[other].clone();
                let p = &mut l.packages[b];
                (p.filename, p.size, p.sha256) = (o.filename, o.size, o.sha256);
            }),
            vec!["package busybox-static", "SHA256"],
            &[],
        ),
        (
            "the same edit, built without the spec",
            Box::new(move |l: &mut Lockfile| {
                let (b, other) = (at(l, "busybox-static"), at(l, "libnuma1"));
                let o = l.packages[other].clone();
                let p = &mut l.packages[b];
                (p.filename, p.size, p.sha256) = (o.filename, o.size, o.sha256);
            }),
            vec!["package busybox-static", "SHA256"],
            &["--packages-only"],
        ),
        (
            "a forged .deb on a mirror named only in the lock",
            {
                let (mirror, sha, size) = (mirror.clone(), forged_sha.clone(), forged_deb.len());
                Box::new(move |l: &mut Lockfile| {
                    let mut r = l.repositories[0].clone();
                    r.url = mirror.clone();
                    l.repositories.push(r);
                    let b = at(l, "busybox-static");
                    let p = &mut l.packages[b];
                    p.repository = l.repositories.len() - 1;
                    (p.size, p.sha256) = (size as u64, sha.clone());
                })
            },
            vec![
                "package busybox-static",
                "127.0.0.1",
                "not one of the verified repositories",
            ],
            &[],
        ),
        (
            "the archive's URL replaced by the mirror's",
            {
                let mirror = mirror.clone();
                Box::new(move |l: &mut Lockfile| {
                    let b = at(l, "busybox-static");
                    let r = l.packages[b].repository;
                    l.repositories[r] = LockedRepository {
                        url: mirror.clone(),
                        ..l.repositories[r].clone()
                    };
                })
            },
            vec![
                "package ",
                "127.0.0.1",
                "not one of the verified repositories",
            ],
            &[],
        ),
        (
            "a forbidden package under its own name",
            {
                let (p, url) = (telnetd.clone(), telnetd_url.clone());
                Box::new(move |l: &mut Lockfile| {
                    let mut p = p.clone();
                    p.repository = repo_of(l, &url);
                    l.packages.push(p);
                })
            },
            vec!["package telnetd", "forbidden", "telnetd"],
            &[],
        ),
        (
            "a forbidden package renamed",
            {
                let (p, url) = (telnetd.clone(), telnetd_url.clone());
                Box::new(move |l: &mut Lockfile| {
                    let mut p = p.clone();
                    p.repository = repo_of(l, &url);
                    p.name = PackageName::new("harmless-tools").unwrap();
                    l.packages.push(p);
                })
            },
            vec!["package harmless-tools", "not in the verified index"],
            &[],
        ),
        (
            "a package the policy requires left out",
            Box::new(move |l: &mut Lockfile| {
                let n = at(l, "libnuma1");
                l.packages.remove(n);
            }),
            vec!["libnuma1", "required by", "site.policy.yaml"],
            &[],
        ),
    ];
    // Every case runs before the verdict, so a regression shows all it lets through.
    let mut wrong = Vec::new();
    for (i, (what, edit, want, extra)) in cases.iter().enumerate() {
        let mut l = good.clone();
        edit(&mut l);
        let name = format!("forged-{i}.lock");
        t.write(&dir.join(&name), l.to_toml());
        let out = format!("img-{i}");
        let mut args = vec!["build", &name, "-o", &out, "--allow-expired", "--quiet"];
        args.extend_from_slice(extra);
        let o = as_tester(&t, &args, dir);
        let all = text(&o);
        eprintln!("{what}: {}", all.trim());
        let missing: Vec<&&str> = want.iter().filter(|w| !all.contains(**w)).collect();
        if o.status.code() != Some(2) || !missing.is_empty() || dir.join(&out).exists() {
            wrong.push(format!(
                "{what}: exit {:?}, missing {missing:?}, image built: {}",
                o.status.code(),
                dir.join(&out).exists()
            ));
        }
    }
    let hits = hits.load(Ordering::SeqCst);
    if hits != 0 {
        wrong.push(format!(
            "the mirror named only in a lock was contacted {hits} times"
        ));
    }
    assert!(
        wrong.is_empty(),
        "forged locks not refused:\n{}",
        wrong.join("\n")
    );
}

/// A lock of one package, the file `deb` (its true size and SHA256), from a mirror that does
/// not exist: only a cache can provide it.
fn lock_of(deb: &[u8]) -> String {
    Lockfile {
        format: vsec::lock::LOCK_FORMAT,
        env_hash: "sha256:00".into(),
        generator: "build_trust test".into(),
        architecture: vsec::deb::Arch::new("amd64").unwrap(),
        source: vsec::lock::SourceFiles::default(),
        repositories: vec![LockedRepository {
            url: "http://127.0.0.1:9/debian".into(),
            suite: "bookworm".into(),
            components: vec!["main".into()],
            release_date: "Sat, 10 May 2025 08:00:00 UTC".into(),
            release_sha256: "0".repeat(64),
        }],
        packages: vec![LockedPackage {
            name: PackageName::new("busybox-static").unwrap(),
            version: DebVersion::parse("1:1.35.0-4+b3").unwrap(),
            architecture: vsec::deb::Arch::new("amd64").unwrap(),
            filename: "pool/main/b/busybox/busybox-static_1.35.0-4+b3_amd64.deb".into(),
            size: deb.len() as u64,
            sha256: imgbuild::fetch::sha256_hex(deb),
            repository: 0,
            reason: vsec::lock::Reason::Kernel,
        }],
    }
    .to_toml()
}

#[test]
fn build_caches_others_can_change_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let (Some(t), Some(other)) = (testkit::unpriv::tester(), testkit::unpriv::other()) else {
        return;
    };
    let chmod =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let scratch = t.scratch("cachev");
    let dir = scratch.path();
    let planted_deb = b"!<arch>\nplanted by the tester\n".to_vec();
    t.write(&dir.join("x.lock"), lock_of(&planted_deb));
    let mut wrong = Vec::new();

    // The attacker's cache, the `.deb` planted under the name a root build looks for.
    let mine = dir.join("mine");
    for d in [&mine, &mine.join("debs")] {
        std::fs::create_dir(d).unwrap();
        t.chown(d);
    }
    let sha = imgbuild::fetch::sha256_hex(&planted_deb);
    t.write(&mine.join(format!("debs/{sha}.deb")), &planted_deb);
    let o = support::vse()
        .args(["build", "x.lock", "-o", "img-root", "--quiet"])
        .current_dir(dir)
        .env("VSE_CACHE", &mine)
        .env("http_proxy", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let all = text(&o);
    eprintln!("root build, the tester's cache: {}", all.trim());
    let want = format!("owned by uid {}", t.uid);
    if o.status.code() != Some(2) || !all.contains("build cache") || !all.contains(&want) {
        wrong.push(format!("root build, the tester's cache: {all}"));
    }

    // Another user's cache, a group-writable one, one under a directory another user may
    // change: each refused for an ordinary build too.
    let others = dir.join("others");
    std::fs::create_dir(&others).unwrap();
    chmod(&others, 0o755);
    other.chown(&others);
    let group = dir.join("group");
    std::fs::create_dir(&group).unwrap();
    t.chown(&group);
    chmod(&group, 0o770);
    let open = dir.join("open");
    std::fs::create_dir_all(open.join("cache")).unwrap();
    other.chown(&open);
    chmod(&open, 0o777);
    t.chown(&open.join("cache"));
    let cases: [(&Path, String); 3] = [
        (&others, format!("owned by uid {}", other.uid)),
        (&group, "lets other users write to it".into()),
        (&open.join("cache"), "can be changed by another user".into()),
    ];
    for (i, (cache, want)) in cases.iter().enumerate() {
        let out = format!("img-{i}");
        let o = t
            .command(VSE)
            .args(["build", "x.lock", "-o", &out, "--quiet"])
            .current_dir(dir)
            .env("VSE_CACHE", cache)
            .env("http_proxy", "http://127.0.0.1:9")
            .output()
            .unwrap();
        let all = text(&o);
        eprintln!("{}: {}", cache.display(), all.trim());
        if o.status.code() != Some(2) || !all.contains(want.as_str()) || dir.join(&out).exists() {
            wrong.push(format!("{}: no {want:?} in {all}", cache.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "caches not refused:\n{}",
        wrong.join("\n")
    );
}

/// An ordinary user who sets no `VSE_CACHE` gets a cache of their own under their home
/// (created 0700, theirs), never the system's: a cache must be private to whoever trusts it.
#[test]
fn a_user_without_vse_cache_builds_into_a_cache_of_their_own() {
    use std::os::unix::fs::MetadataExt;
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let scratch = t.scratch("owncache");
    let home = scratch.path();
    t.write(&home.join("x.lock"), lock_of(b"!<arch>\nany\n"));
    let o = t
        .command(VSE)
        .args(["build", "x.lock", "-o", "img", "--quiet"])
        .current_dir(home)
        .env_remove("VSE_CACHE")
        .env("HOME", home)
        .env("http_proxy", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let all = text(&o);
    let debs = home.join(".cache/vse/debs");
    let m = std::fs::metadata(&debs).unwrap_or_else(|e| panic!("{}: {e}; {all}", debs.display()));
    assert_eq!((m.uid(), m.mode() & 0o777), (t.uid, 0o700), "{all}");
    assert!(!all.contains("/var/cache/vse"), "{all}");
    assert!(!home.join("img").exists(), "{all}");
}
