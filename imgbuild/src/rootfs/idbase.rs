//! The host ids a root build's sandbox runs as: [`ID_COUNT`] consecutive uids and gids from a
//! base the site may choose (`VSE_BUILD_ID_BASE`). No account of the host may own one of
//! them: a user holding such an id could signal or read what the build's commands run and
//! write. The base is refused when the range meets an id of `/etc/passwd` or `/etc/group`, or
//! a subordinate range of `/etc/subuid` or `/etc/subgid` (whose owner could map it with
//! `newuidmap`). Accounts of a directory service are not listed there: a site that has them
//! picks a base outside the ranges its directory hands out.

use std::ops::Range;
use std::path::Path;

/// The environment variable that sets the base (decimal, or hexadecimal with `0x`).
pub const ENV: &str = "VSE_BUILD_ID_BASE";
/// The default base: above the ranges distributions, systemd (`systemd-nspawn` containers end
/// at 0x6FFFFFFF) and common directory services hand out.
pub const DEFAULT_ID_BASE: u32 = 0x7000_0000;
/// How many ids the sandbox has (Debian's static and dynamic system and user ids).
pub const ID_COUNT: u32 = 65536;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdBaseError {
    #[error(transparent)]
    SubIds(#[from] crate::rootless::subid::SubIdError),
    #[error(
        "this user namespace maps only {mapped} of the ids 0..{ID_COUNT} ({file}); hint: run the build as root, or as an ordinary user, whose build maps its own"
    )]
    Narrow { file: &'static str, mapped: u64 },
    #[error(
        "{ENV}={value}: {reason}; hint: a number (decimal or 0x…) from 65536 to {max}, whose range of {ID_COUNT} ids no host account uses",
        max = u32::MAX - 1 - ID_COUNT
    )]
    Invalid { value: String, reason: &'static str },
    #[error(
        "the build sandbox's host ids {first}..={last} ({origin}) include {what} of `{name}` ({file}:{line}); hint: set {ENV} to a base whose {ID_COUNT} ids no account or subordinate range of this host uses"
    )]
    Taken {
        first: u32,
        last: u32,
        origin: &'static str,
        what: String,
        name: String,
        file: String,
        line: usize,
    },
}

/// The base in force: `VSE_BUILD_ID_BASE` or the default, checked against this host's files.
pub fn id_base() -> Result<u32, IdBaseError> {
    let (base, origin) = match std::env::var(ENV) {
        Ok(v) => (parse(&v)?, "from VSE_BUILD_ID_BASE"),
        Err(_) => (DEFAULT_ID_BASE, "the default base"),
    };
    let read = |p: &str| std::fs::read_to_string(Path::new(p)).unwrap_or_default();
    let files = [
        ("/etc/passwd", read("/etc/passwd")),
        ("/etc/group", read("/etc/group")),
        ("/etc/subuid", read("/etc/subuid")),
        ("/etc/subgid", read("/etc/subgid")),
    ];
    check(base, origin, &files)?;
    Ok(base)
}

fn parse(v: &str) -> Result<u32, IdBaseError> {
    let bad = |reason| IdBaseError::Invalid {
        value: v.to_string(),
        reason,
    };
    let t = v.trim();
    let n = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse::<u64>(),
    }
    .map_err(|_| bad("not a number"))?;
    if n < u64::from(ID_COUNT) {
        return Err(bad(
            "the range would include the host's system and user ids",
        ));
    }
    // (uid_t)-1 means "no id" to the kernel: the range must end below it.
    if n + u64::from(ID_COUNT) > u64::from(u32::MAX) {
        return Err(bad("the range would pass the largest id"));
    }
    Ok(n as u32)
}

/// What a build by this process needs: the checked base when it runs as root on the host
/// (whose sandbox maps the range), the user's subordinate ids otherwise (its build runs in a
/// user namespace of them, [`crate::rootless`]). Builds call it before they fetch anything,
/// so a bad base or a missing range costs no work.
pub fn check_for_this_process() -> Result<(), IdBaseError> {
    if crate::rootless::needed() {
        crate::rootless::ranges()?;
    } else {
        id_base()?;
    }
    Ok(())
}

/// When this process is in a user namespace other than the host's (the helper of a rootless
/// build): the uid and gid maps of a nested namespace that maps its ids 0..[`ID_COUNT`] one
/// to one. They must all be mapped here, and each line stays within one line of this
/// namespace's map (the kernel maps a line through a single line of the parent's).
pub fn namespace_maps() -> Result<Option<[String; 2]>, IdBaseError> {
    let maps = ["/proc/self/uid_map", "/proc/self/gid_map"]
        .map(|p| (p, std::fs::read_to_string(p).unwrap_or_default()));
    if maps.iter().all(|(_, m)| is_initial(m)) {
        return Ok(None);
    }
    let mut out = [String::new(), String::new()];
    for (o, (file, text)) in out.iter_mut().zip(maps) {
        let (map, mapped) = identity(&text);
        if mapped < u64::from(ID_COUNT) {
            return Err(IdBaseError::Narrow { file, mapped });
        }
        *o = map;
    }
    Ok(Some(out))
}

/// The host's own map: every id to itself.
fn is_initial(map: &str) -> bool {
    let f: Vec<&str> = map.split_whitespace().collect();
    f == ["0", "0", "4294967295"]
}

/// The one-to-one map of the ids 0..[`ID_COUNT`] that `map` (a `uid_map`, whose lines do not
/// overlap) maps, split as its lines are, and how many ids that is.
fn identity(map: &str) -> (String, u64) {
    let mut out = String::new();
    let mut mapped = 0;
    for l in map.lines() {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [inside, _, count] = f[..] else {
            continue;
        };
        let n = u64::from(ID_COUNT)
            .min(inside + count)
            .saturating_sub(inside);
        if n > 0 {
            out.push_str(&format!("{inside} {inside} {n}\n"));
            mapped += n;
        }
    }
    (out, mapped)
}

impl vse_exit::Classify for IdBaseError {
    /// The site's (or the caller's) choice of range: something to fix, not a host failure.
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            IdBaseError::SubIds(e) => e.kind(),
            _ => vse_exit::ErrorKind::InvalidInput,
        }
    }
}

/// `files`: (path, text) of passwd, group (`name:x:id:…`) and subuid, subgid
/// (`name:first:count`), told apart by their path.
fn check(base: u32, origin: &'static str, files: &[(&str, String)]) -> Result<(), IdBaseError> {
    let range = u64::from(base)..u64::from(base) + u64::from(ID_COUNT);
    for (file, text) in files {
        let sub = file.starts_with("/etc/sub");
        for (i, line) in text.lines().enumerate() {
            let f: Vec<&str> = line.split(':').collect();
            let hit = if sub {
                subordinate(&f, &range)
            } else {
                f.get(2)
                    .and_then(|id| id.trim().parse::<u64>().ok())
                    .filter(|id| range.contains(id))
                    .map(|id| format!("id {id}"))
            };
            if let Some(what) = hit {
                return Err(IdBaseError::Taken {
                    first: base,
                    last: base + (ID_COUNT - 1),
                    origin,
                    what,
                    name: f[0].to_string(),
                    file: file.to_string(),
                    line: i + 1,
                });
            }
        }
    }
    Ok(())
}

fn subordinate(f: &[&str], range: &Range<u64>) -> Option<String> {
    let first = f.get(1)?.trim().parse::<u64>().ok()?;
    let count = f.get(2)?.trim().parse::<u64>().ok()?;
    (first < range.end && range.start < first + count)
        .then(|| format!("the subordinate ids {first}..{}", first + count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(passwd: &str, subuid: &str) -> Vec<(&'static str, String)> {
        vec![
            ("/etc/passwd", passwd.to_string()),
            ("/etc/group", "root:x:0:\n".to_string()),
            ("/etc/subuid", subuid.to_string()),
        ]
    }

    #[test]
    fn a_namespace_s_map_is_told_from_the_host_s_and_measured() {
        assert!(is_initial("         0          0 4294967295\n"));
        assert!(!is_initial("0 1001 1\n1 100000 65535\n"));
        assert_eq!(
            identity("         0       1001          1\n         1     100000      65535\n"),
            ("0 0 1\n1 1 65535\n".to_string(), 65536)
        );
        assert_eq!(identity("0 1001 1\n"), ("0 0 1\n".to_string(), 1));
        assert_eq!(
            identity("0 0 4294967295\n"),
            ("0 0 65536\n".to_string(), 65536)
        );
    }

    #[test]
    fn bases_are_parsed_and_bounded() {
        assert_eq!(parse("1879048192"), Ok(DEFAULT_ID_BASE));
        assert_eq!(parse("0x70000000"), Ok(DEFAULT_ID_BASE));
        for bad in ["", "x", "-1", "1000", "0xffffffff", "4294901760"] {
            assert!(
                matches!(parse(bad), Err(IdBaseError::Invalid { .. })),
                "{bad}"
            );
        }
        assert_eq!(parse("4294901759"), Ok(u32::MAX - ID_COUNT));
    }

    #[test]
    fn a_range_holding_an_account_or_a_subordinate_range_is_refused() {
        let base = 2_000_000;
        let ok = files(
            "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n",
            "",
        );
        assert_eq!(check(base, "test", &ok), Ok(()));
        let ldap = files(
            "root:x:0:0::/root:/bin/sh\nsvc:x:2000100:10::/:/bin/sh\n",
            "",
        );
        let e = check(base, "test", &ldap).unwrap_err();
        assert!(
            matches!(&e, IdBaseError::Taken { name, line: 2, .. } if name == "svc"),
            "{e}"
        );
        assert!(e.to_string().contains("/etc/passwd:2"), "{e}");
        // A subordinate range that only overlaps the end of the base's.
        let sub = files("root:x:0:0::/root:/bin/sh\n", "u:1934464:100000\n");
        let e = check(base, "test", &sub).unwrap_err();
        assert!(e.to_string().contains("/etc/subuid:1"), "{e}");
        let after = files("", &format!("u:{}:65536\n", base + ID_COUNT));
        assert_eq!(check(base, "test", &after), Ok(()));
    }
}
