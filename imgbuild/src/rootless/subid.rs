//! The subordinate ids a user may map (`/etc/subuid`, `/etc/subgid`, as `newuidmap` reads
//! them): a line `name:first:count` or `uid:first:count`. A rootless build needs a range of at
//! least [`NEEDED`] ids in each file, for the image's ids 1..65535 (its id 0 is the user).

use crate::rootfs::idbase::ID_COUNT;

/// Subordinate ids a rootless build maps: the image's ids other than root.
pub const NEEDED: u32 = ID_COUNT - 1;

/// A user's first usable range in one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubRange {
    pub first: u32,
    pub count: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubIdError {
    #[error(
        "{file} gives `{user}` (uid {uid}) {found}, and a build as an ordinary user needs {NEEDED} subordinate ids to give the image's packages their own users and groups; hint: an admin runs `usermod --add-subuids N-M --add-subgids N-M {user}` with a range of 65536 ids no account uses (or adds `{user}:N:65536` to /etc/subuid and /etc/subgid), and installs newuidmap and newgidmap (Debian package uidmap); or build as root"
    )]
    Missing {
        file: &'static str,
        user: String,
        uid: u32,
        found: String,
    },
}

impl vse_exit::Classify for SubIdError {
    /// The host's set-up for this user: an admin fixes it, as for a missing tool.
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::MissingComponent
    }
}

/// The first range of `user` (by name or uid) in `text` with at least [`NEEDED`] ids.
pub fn find(file: &'static str, text: &str, user: &str, uid: u32) -> Result<SubRange, SubIdError> {
    let mut smaller = None;
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split(':').collect();
        let [who, first, count] = f[..] else {
            continue;
        };
        if who != user && who.parse::<u32>().ok() != Some(uid) {
            continue;
        }
        let (Ok(first), Ok(count)) = (first.parse::<u32>(), count.parse::<u32>()) else {
            continue;
        };
        // A range must end below (uid_t)-1, which the kernel reserves.
        if count >= NEEDED && first.checked_add(NEEDED).is_some_and(|e| e < u32::MAX) {
            return Ok(SubRange { first, count });
        }
        smaller.get_or_insert(count);
    }
    Err(SubIdError::Missing {
        file,
        user: user.to_string(),
        uid,
        found: smaller.map_or("no range".into(), |c| format!("only a range of {c} ids")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_s_range_is_found_by_name_or_uid_and_must_be_wide_enough() {
        let text = "other:100000:65536\nu:165536:1000\n# comment\n1001:231072:65536\n";
        assert_eq!(
            find("/etc/subuid", text, "u", 1001),
            Ok(SubRange {
                first: 231072,
                count: 65536
            })
        );
        let e = find("/etc/subuid", "u:165536:1000\n", "u", 1001).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("only a range of 1000 ids"), "{msg}");
        assert!(msg.contains("usermod --add-subuids"), "{msg}");
        let e = find("/etc/subgid", "", "u", 1001).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/subgid gives `u` (uid 1001) no range")
        );
        assert!(find("/etc/subuid", "u:4294967000:65536\n", "u", 1).is_err());
    }
}
