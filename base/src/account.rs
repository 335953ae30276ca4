//! Accounts of the host's user database (`getpwuid_r`, `getgrouplist`): who a uid is, for
//! the guest's account, audit records, and root acting as a job's owner.

use std::ffi::{CStr, CString};

/// A `getpw*_r` buffer: large enough for any sane entry, grown on ERANGE.
const START: usize = 1024;
const MAX: usize = 1 << 20;

/// A user of the host's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passwd {
    pub uid: u32,
    pub name: String,
    pub gid: u32,
    pub home: String,
}

/// The entry of `uid`, if the host has one.
pub fn passwd(uid: u32) -> Option<Passwd> {
    let mut buf = vec![0u8; START];
    loop {
        // SAFETY: all-zero is a valid `passwd` (plain data: integers and null pointers).
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: getpwuid_r writes into `pw` and `buf` (of the given length) and sets `res`.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut res) };
        if rc == libc::ERANGE && buf.len() < MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || res.is_null() {
            return None;
        }
        // SAFETY: on success both fields point to NUL-terminated strings inside `buf`.
        let (name, home) = unsafe { (CStr::from_ptr(pw.pw_name), CStr::from_ptr(pw.pw_dir)) };
        return Some(Passwd {
            uid,
            name: name.to_string_lossy().into_owned(),
            gid: pw.pw_gid,
            home: home.to_string_lossy().into_owned(),
        });
    }
}

impl Passwd {
    /// Makes `cmd` exec as this user: its groups, its gid, then its uid (only root can). A
    /// failure to drop fails the spawn, so the command never runs with more rights.
    pub fn exec_as(&self, cmd: &mut std::process::Command) {
        exec_as_ids(cmd, self.uid, self.gid, self.groups());
    }

    /// Every group the user is in: the primary one and the group database's.
    pub fn groups(&self) -> Vec<u32> {
        let Ok(name) = CString::new(self.name.as_str()) else {
            return vec![self.gid];
        };
        let mut n: libc::c_int = 32;
        loop {
            let mut v = vec![0 as libc::gid_t; n as usize];
            let want = n;
            // SAFETY: `v` has room for `n` ids; getgrouplist sets `n` to the count it needs.
            let rc = unsafe { libc::getgrouplist(name.as_ptr(), self.gid, v.as_mut_ptr(), &mut n) };
            if rc >= 0 {
                v.truncate(n.max(0) as usize);
                return v;
            }
            if n <= want {
                n = want * 2;
            }
            if n > 65536 {
                return vec![self.gid];
            }
        }
    }
}

/// The id of the group `name` in the host's group database, if it has one.
pub fn group_id(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; START];
    loop {
        // SAFETY: all-zero is a valid `group` (plain data: integers and null pointers).
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::group = std::ptr::null_mut();
        // SAFETY: getgrnam_r writes into `gr` and `buf` (of the given length) and sets `res`.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut gr,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut res,
            )
        };
        if rc == libc::ERANGE && buf.len() < MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        return (rc == 0 && !res.is_null()).then_some(gr.gr_gid);
    }
}

/// Makes `cmd` exec with `groups`, `gid`, then `uid` (only root can change them). A failure
/// to drop fails the spawn, so the command never runs with more rights.
pub fn exec_as_ids(cmd: &mut std::process::Command, uid: u32, gid: u32, groups: Vec<u32>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe system calls between fork and exec, on data owned by the
    // closure.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_found_by_name() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-here"), None);
    }

    #[test]
    fn root_is_root() {
        let r = passwd(0).expect("every host has root");
        assert_eq!((r.name.as_str(), r.gid), ("root", 0));
        assert!(r.groups().contains(&0));
        assert_eq!(passwd(u32::MAX - 7), None);
    }
}
