//! Keeping a cache of images within a site's bounds (`cache.max_size`, `cache.max_age`):
//! least recently used first, never an entry in use.
//!
//! An entry is a subdirectory of a cache directory whose name does not start with `.` (those
//! are partial copies, stamps, locks and the like, which their owners sweep). Its last use is
//! its directory's modification time, which [`touch`] sets whenever a job takes the entry. An
//! entry is in use while any process of this user holds one of its files open (a VM's QEMU
//! holds its root disk, a copy being read holds its part), and recently used entries are
//! spared ([`GRACE`]): a job may have just staged one it has not opened yet. An entry goes by
//! a rename to a dot-name first, so nothing takes a half-removed entry for a whole one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A cache's bounds; `None` fields do not bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Bytes on disk (allocated blocks) all entries together may take.
    pub max_bytes: Option<u64>,
    /// Seconds since its last use after which an entry goes, whatever the size.
    pub max_age_s: Option<u64>,
}

impl Limits {
    pub fn is_unbounded(&self) -> bool {
        self.max_bytes.is_none() && self.max_age_s.is_none()
    }
}

/// Entries used this recently stay even over the size bound.
pub const GRACE: Duration = Duration::from_secs(600);

/// What one pass removed and what stayed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Each removed entry with the bytes it took.
    pub removed: Vec<(PathBuf, u64)>,
    /// Bytes the remaining entries take.
    pub kept_bytes: u64,
    /// Bytes over `max_bytes` that could not go (entries in use or recently used).
    pub over_bytes: u64,
}

/// Marks `taken` (an entry a job is about to use) as used now, then keeps `dirs` within
/// `limits`. Returns what to tell the user: what went, and what could not.
pub fn keep(dirs: &[&Path], taken: &Path, limits: &Limits) -> Vec<String> {
    let _ = touch(taken);
    if limits.is_unbounded() {
        return Vec::new();
    }
    let e = evict(dirs, limits, SystemTime::now(), &in_use);
    let mut said = Vec::new();
    let where_ = dirs
        .first()
        .map_or_else(String::new, |d| d.display().to_string());
    if !e.removed.is_empty() {
        let freed: u64 = e.removed.iter().map(|(_, b)| b).sum();
        let n = e.removed.len();
        said.push(format!(
            "{where_}: removed {n} unused entr{} ({} MiB) to keep within the policy's cache bounds",
            if n == 1 { "y" } else { "ies" },
            freed >> 20
        ));
    }
    if e.over_bytes > 0 {
        said.push(format!(
            "{where_}: {} MiB over cache.max_size, all in use or used in the last {} minutes",
            e.over_bytes >> 20,
            GRACE.as_secs() / 60
        ));
    }
    said
}

/// Marks `entry` as used now (its directory's modification time).
pub fn touch(entry: &Path) -> std::io::Result<()> {
    std::fs::File::open(entry)?.set_modified(SystemTime::now())
}

struct Entry {
    path: PathBuf,
    used: SystemTime,
    bytes: u64,
}

/// One pass over the entries of `dirs` (each a cache directory) under `limits`: first every
/// entry unused for longer than `max_age_s`, then the least recently used until the rest fit
/// in `max_bytes`. `in_use` says whether a process holds an entry's files; [`in_use`] is the
/// real one.
pub fn evict(
    dirs: &[&Path],
    limits: &Limits,
    now: SystemTime,
    in_use: &dyn Fn(&Path) -> bool,
) -> Evicted {
    let mut entries: Vec<Entry> = dirs.iter().flat_map(|d| entries(d)).collect();
    entries.sort_by_key(|e| e.used);
    let age = |e: &Entry| now.duration_since(e.used).unwrap_or_default();
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut out = Evicted::default();
    for e in entries {
        let expired = limits
            .max_age_s
            .is_some_and(|s| age(&e) > Duration::from_secs(s));
        let too_big = limits.max_bytes.is_some_and(|m| total > m) && age(&e) > GRACE;
        if (expired || too_big) && !in_use(&e.path) && remove(&e.path) {
            total -= e.bytes;
            out.removed.push((e.path, e.bytes));
        }
    }
    out.kept_bytes = total;
    out.over_bytes = limits.max_bytes.map_or(0, |m| total.saturating_sub(m));
    out
}

fn entries(dir: &Path) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|d| !d.file_name().as_encoded_bytes().starts_with(b"."))
        .filter_map(|d| {
            let m = std::fs::symlink_metadata(d.path()).ok()?;
            m.is_dir().then(|| Entry {
                path: d.path(),
                used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                bytes: allocated(&d.path()),
            })
        })
        .collect()
}

/// Bytes on disk under `path` (symbolic links not followed).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = m.blocks() * 512;
    if !m.is_dir() {
        return own;
    }
    let children = std::fs::read_dir(path).map_or(0, |rd| {
        rd.flatten().map(|d| allocated(&d.path())).sum::<u64>()
    });
    own + children
}

/// Renames `entry` aside, then removes it and its `.NAME.verified` stamp. False when the
/// rename fails (someone else removed or replaced it meanwhile).
fn remove(entry: &Path) -> bool {
    let (Some(parent), Some(name)) = (entry.parent(), entry.file_name()) else {
        return false;
    };
    let mut aside = std::ffi::OsString::from(".evicted-");
    aside.push(name);
    aside.push(format!("-{}", std::process::id()));
    let aside = parent.join(aside);
    if std::fs::rename(entry, &aside).is_err() {
        return false;
    }
    let mut stamp = std::ffi::OsString::from(".");
    stamp.push(name);
    stamp.push(".verified");
    let _ = std::fs::remove_file(parent.join(stamp));
    let _ = std::fs::remove_dir_all(&aside);
    true
}

/// Whether a process this user may inspect holds a file under `entry` open (its descriptors
/// in `/proc`). Other users' processes are not visible, but their caches are their own.
pub fn in_use(entry: &Path) -> bool {
    open_paths().iter().any(|p| p.starts_with(entry))
}

fn open_paths() -> HashSet<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    procs
        .flatten()
        .filter(|p| {
            p.file_name()
                .as_encoded_bytes()
                .iter()
                .all(u8::is_ascii_digit)
        })
        .filter_map(|p| std::fs::read_dir(p.path().join("fd")).ok())
        .flat_map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// An entry of `kib` KiB last used `ago` before now.
    fn entry(dir: &Path, name: &str, kib: usize, ago: Duration) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("root"), vec![7u8; kib * 1024]).unwrap();
        let when = SystemTime::now() - ago;
        std::fs::File::open(&p).unwrap().set_modified(when).unwrap();
        p
    }

    fn names(e: &Evicted) -> Vec<String> {
        (e.removed.iter())
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_rest_fit() {
        let d = tempfile::tempdir().unwrap();
        entry(d.path(), "old", 400, 3 * DAY);
        entry(d.path(), "older", 400, 5 * DAY);
        let kept = entry(d.path(), "new", 400, 2 * DAY);
        std::fs::write(d.path().join(".old.verified"), b"stamp").unwrap();
        std::fs::create_dir(d.path().join(".partial-x")).unwrap();
        let limits = Limits {
            max_bytes: Some(500 * 1024),
            max_age_s: None,
        };
        let e = evict(&[d.path()], &limits, SystemTime::now(), &|_| false);
        assert_eq!(names(&e), ["older", "old"]);
        assert!(
            e.kept_bytes >= 400 * 1024 && e.kept_bytes < 500 * 1024,
            "{e:?}"
        );
        assert_eq!(e.over_bytes, 0);
        assert!(kept.exists() && d.path().join(".partial-x").exists());
        assert!(!d.path().join(".old.verified").exists());
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 2, "nothing aside is left: {left:?}");
    }

    #[test]
    fn an_entry_in_use_or_just_used_stays_and_the_excess_is_told() {
        let d = tempfile::tempdir().unwrap();
        let busy = entry(d.path(), "busy", 400, 9 * DAY);
        entry(d.path(), "fresh", 400, Duration::from_secs(60));
        let limits = Limits {
            max_bytes: Some(100 * 1024),
            max_age_s: Some(DAY.as_secs()),
        };
        let e = evict(&[d.path()], &limits, SystemTime::now(), &|p| p == busy);
        assert!(e.removed.is_empty(), "{e:?}");
        assert!(e.over_bytes > 600 * 1024, "{e:?}");
    }

    #[test]
    fn an_expired_entry_goes_whatever_the_size() {
        let d = tempfile::tempdir().unwrap();
        entry(d.path(), "stale", 4, 8 * DAY);
        entry(d.path(), "recent", 4, 2 * DAY);
        let limits = Limits {
            max_bytes: None,
            max_age_s: Some(7 * DAY.as_secs()),
        };
        let e = evict(&[d.path()], &limits, SystemTime::now(), &|_| false);
        assert_eq!(names(&e), ["stale"]);
    }

    #[test]
    fn a_file_held_open_marks_its_entry_in_use_and_touch_renews_it() {
        let d = tempfile::tempdir().unwrap();
        let p = entry(d.path(), "held", 4, 3 * DAY);
        assert!(!in_use(&p));
        let f = std::fs::File::open(p.join("root")).unwrap();
        assert!(in_use(&p));
        drop(f);
        touch(&p).unwrap();
        let age = SystemTime::now()
            .duration_since(std::fs::metadata(&p).unwrap().modified().unwrap())
            .unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
    }
}
