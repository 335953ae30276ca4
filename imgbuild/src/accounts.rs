//! The spec's groups and users, made by the image's own `groupadd` and `useradd`, then read
//! back from the image's `/etc/group` and `/etc/passwd`: an image whose accounts differ from
//! the spec in any field (a gid a package's group already has, a shell or home `useradd`
//! chose itself) fails the build, named, instead of carrying numbers the policy never saw.
//!
//! A user's first group is its primary group; the rest are supplementary. A user who lists
//! none gets a group of its own name: the spec's or image's group of that name when there is
//! one, else a new one whose gid is the user's uid (the policy checks it as a gid).

use crate::rootfs::chroot::{ChrootError, RunOptions, run_in_root};
use crate::rootfs::inroot::InRoot;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserEntry {
    pub name: String,
    pub uid: u32,
    /// The primary group first, then the supplementary ones.
    pub groups: Vec<String>,
    pub shell: String,
    pub home: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error(
        "{what} `{name}`: the image has {found} where the spec asks for {wanted}; hint: {hint}"
    )]
    Differs {
        what: &'static str,
        name: String,
        found: String,
        wanted: String,
        hint: &'static str,
    },
    #[error("user `{user}`: its group `{group}` is neither in the spec's groups nor in the image")]
    NoGroup { user: String, group: String },
    #[error("reading the image's {file}: {source}")]
    Read {
        file: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Chroot(#[from] ChrootError),
}

/// One line of `/etc/group` or `/etc/passwd`, split at its colons.
fn entry(
    image: &InRoot,
    file: &'static str,
    name: &str,
) -> Result<Option<Vec<String>>, AccountError> {
    let text = image
        .read_to_string(file)
        .map_err(|source| AccountError::Read { file, source })?;
    Ok(text
        .lines()
        .map(|l| l.split(':').map(str::to_string).collect::<Vec<_>>())
        .find(|f| f.first().is_some_and(|n| n == name)))
}

fn field(e: &[String], i: usize) -> &str {
    e.get(i).map_or("", String::as_str)
}

/// Makes the spec's groups, then its users, in the image under `root`, and checks the result.
pub fn apply(
    root: &Path,
    groups: &[GroupEntry],
    users: &[UserEntry],
    env: &[(String, String)],
    out: &dyn Fn(&str),
) -> Result<(), AccountError> {
    if groups.is_empty() && users.is_empty() {
        return Ok(());
    }
    let image = InRoot::open(root).map_err(|source| AccountError::Read {
        file: "root",
        source,
    })?;
    let run = |argv: &[&str]| run_in_root(root, argv, env, &RunOptions::default(), out);
    let add_group = |name: &str, gid: u32| -> Result<(), AccountError> {
        match entry(&image, "etc/group", name)? {
            Some(e) if field(&e, 2) == gid.to_string() => Ok(()),
            Some(e) => Err(AccountError::Differs {
                what: "group",
                name: name.to_string(),
                found: format!("gid {}", field(&e, 2)),
                wanted: format!("gid {gid}"),
                hint: "a package of the image made this group: give it its gid in the spec, or use another name",
            }),
            None => Ok(run(&[
                "/usr/sbin/groupadd",
                "--gid",
                &gid.to_string(),
                name,
            ])?),
        }
    };
    for g in groups {
        add_group(&g.name, g.gid)?;
    }
    for u in users {
        let primary = match u.groups.first() {
            Some(g) => g.clone(),
            None => {
                if entry(&image, "etc/group", &u.name)?.is_none() {
                    add_group(&u.name, u.uid)?;
                }
                u.name.clone()
            }
        };
        let uid = u.uid.to_string();
        let rest = u
            .groups
            .iter()
            .skip(1)
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        let mut argv = vec![
            "/usr/sbin/useradd",
            "--create-home",
            "--uid",
            &uid,
            "--gid",
            &primary,
            "--shell",
            &u.shell,
            "--home-dir",
            &u.home,
        ];
        if !rest.is_empty() {
            argv.extend(["--groups", &rest]);
        }
        argv.push(&u.name);
        for g in &u.groups {
            if entry(&image, "etc/group", g)?.is_none() {
                return Err(AccountError::NoGroup {
                    user: u.name.clone(),
                    group: g.clone(),
                });
            }
        }
        run(&argv)?;
    }
    verify(&image, groups, users)
}

/// Every group and user as the spec says, read from the image's own files.
fn verify(image: &InRoot, groups: &[GroupEntry], users: &[UserEntry]) -> Result<(), AccountError> {
    let differs = |what, name: &str, found: String, wanted: String| AccountError::Differs {
        what,
        name: name.to_string(),
        found,
        wanted,
        hint: "the image's useradd or a package changed it; report it with the spec",
    };
    for g in groups {
        let e = entry(image, "etc/group", &g.name)?.unwrap_or_default();
        if field(&e, 2) != g.gid.to_string() {
            return Err(differs(
                "group",
                &g.name,
                format!("gid {:?}", field(&e, 2)),
                format!("gid {}", g.gid),
            ));
        }
    }
    for u in users {
        let e = entry(image, "etc/passwd", &u.name)?.unwrap_or_default();
        let primary = u.groups.first().unwrap_or(&u.name);
        let gid = entry(image, "etc/group", primary)?
            .map(|g| field(&g, 2).to_string())
            .unwrap_or_default();
        let want = [
            ("uid", u.uid.to_string(), 2),
            ("gid", gid, 3),
            ("home", u.home.clone(), 5),
            ("shell", u.shell.clone(), 6),
        ];
        for (what, value, i) in want {
            if field(&e, i) != value {
                return Err(differs(
                    "user",
                    &u.name,
                    format!("{what} {:?}", field(&e, i)),
                    format!("{what} {value:?}"),
                ));
            }
        }
        for g in u.groups.iter().skip(1) {
            let members = entry(image, "etc/group", g)?.unwrap_or_default();
            if !field(&members, 3).split(',').any(|m| m == u.name) {
                return Err(differs(
                    "user",
                    &u.name,
                    format!("no membership of `{g}`"),
                    format!("a member of `{g}`"),
                ));
            }
        }
    }
    Ok(())
}
