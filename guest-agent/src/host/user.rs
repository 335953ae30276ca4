//! Who this host process runs as, for the guest: a command a host process asks for runs in the
//! guest as that process's user (the job's: node services drop to it before they run jobs).

use crate::protocol::GuestUser;
use std::ffi::CStr;

/// A `getpw*_r`/`getgr*_r` buffer: large enough for any sane entry, grown on ERANGE.
const START: usize = 1024;
const MAX: usize = 1 << 20;

/// `(name, home)` of `uid` in the host's user database.
fn passwd(uid: u32) -> Option<(String, String)> {
    vse_base::account::passwd(uid).map(|p| (p.name, p.home))
}

/// The name of group `gid` in the host's group database.
fn group(gid: u32) -> Option<String> {
    let mut buf = vec![0u8; START];
    loop {
        // SAFETY: all-zero is a valid `group` (plain data: integers and null pointers).
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::group = std::ptr::null_mut();
        // SAFETY: getgrgid_r writes into `gr` and `buf` (of the given length) and sets `res`.
        let rc =
            unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut res) };
        if rc == libc::ERANGE && buf.len() < MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || res.is_null() {
            return None;
        }
        // SAFETY: on success `gr_name` points to a NUL-terminated string inside `buf`.
        return Some(
            unsafe { CStr::from_ptr(gr.gr_name) }
                .to_string_lossy()
                .into_owned(),
        );
    }
}

/// The supplementary groups of this process.
fn groups() -> Vec<u32> {
    // SAFETY: getgroups(0, NULL) returns the count; the second call fills at most `n` ids.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        if n <= 0 {
            return Vec::new();
        }
        let mut v = vec![0 as libc::gid_t; n as usize];
        let got = libc::getgroups(n, v.as_mut_ptr());
        v.truncate(got.max(0) as usize);
        v
    }
}

impl GuestUser {
    /// The guest's root (`--guest-root`, where a site policy allows it).
    pub fn root() -> GuestUser {
        GuestUser {
            uid: 0,
            gid: 0,
            groups: vec![0],
            name: "root".into(),
            group: "root".into(),
            home: "/root".into(),
        }
    }

    /// This process's user: its real uid and gid, its supplementary groups, and its name and
    /// home from the host's user database (`u<uid>` and `/` for an id the database lacks, as
    /// a container's may).
    pub fn current() -> GuestUser {
        // SAFETY: getuid(2) and getgid(2) cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let (name, home) = passwd(uid).unwrap_or_else(|| (format!("u{uid}"), "/".into()));
        GuestUser {
            uid,
            gid,
            groups: groups(),
            name,
            group: group(gid).unwrap_or_else(|| format!("g{gid}")),
            home,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_user_is_this_process_s() {
        let u = GuestUser::current();
        // SAFETY: getuid(2) cannot fail.
        assert_eq!(u.uid, unsafe { libc::getuid() });
        let id = |flag| {
            let o = std::process::Command::new("id").arg(flag).output().unwrap();
            String::from_utf8(o.stdout).unwrap().trim().to_string()
        };
        assert_eq!(u.name, id("-un"));
        assert_eq!(u.gid.to_string(), id("-g"));
        assert_eq!(u.group, id("-gn"));
        let mut want: Vec<u32> = id("-G").split(' ').map(|g| g.parse().unwrap()).collect();
        let mut got = u.groups.clone();
        // `id -G` lists the primary group too, getgroups may not.
        got.push(u.gid);
        got.sort_unstable();
        got.dedup();
        want.sort_unstable();
        want.dedup();
        assert_eq!(got, want);
    }
}
