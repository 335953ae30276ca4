//! A process's cgroups as `/proc/PID/cgroup` names them, and where they are in this mount
//! namespace. A node of a test cluster (or a container) may see a hierarchy mounted from a
//! sub-cgroup, so a path is resolved through the mount whose root holds it, never by
//! joining it to `/sys/fs/cgroup/CONTROLLER`.

use std::path::PathBuf;

/// One line of `/proc/PID/cgroup`: `ID:CONTROLLERS:PATH` (v2: `0::PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    pub id: String,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_cgroups(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.to_string();
            let controllers = it.next()?;
            let path = it.next()?.to_string();
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            Some(CgroupLine {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// Where a cgroup of `line`'s hierarchy is in this mount namespace: the mount of that
/// hierarchy (v1: the one whose options name its controllers; v2: the cgroup2 mount) whose
/// root holds the path.
pub fn cgroup_dir(line: &CgroupLine, mountinfo: &str) -> Option<PathBuf> {
    let (point, rel) = mount_of(line, mountinfo)?;
    Some(point.join(rel))
}

/// The mount point of `line`'s hierarchy and the cgroup's path below it (no leading `/`).
pub fn mount_of(line: &CgroupLine, mountinfo: &str) -> Option<(PathBuf, String)> {
    // Newest first: a mount over another (a node's own cgroup bound over the hierarchy's
    // mount point) hides the older one.
    for m in mountinfo.lines().rev() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let Some((pre, post)) = m.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let (Some(root), Some(point), Some(fstype), Some(sup)) =
            (pre.get(3), pre.get(4), post.first(), post.get(2))
        else {
            continue;
        };
        let ours = match (*fstype, line.controllers.is_empty()) {
            ("cgroup2", true) => true,
            ("cgroup", false) => {
                let opts: Vec<&str> = sup.split(',').collect();
                line.controllers.iter().all(|c| opts.contains(&c.as_str()))
            }
            _ => false,
        };
        let root = unescape(root);
        let rel = match root.as_str() {
            "/" => Some(line.path.as_str()),
            r => line
                .path
                .strip_prefix(r)
                .filter(|rest| rest.is_empty() || rest.starts_with('/')),
        };
        if let (true, Some(rel)) = (ours, rel) {
            let rel = rel.trim_matches('/').to_string();
            return Some((PathBuf::from(unescape(point)), rel));
        }
    }
    None
}

/// Mount points in mountinfo escape spaces and the like as `\NNN` (octal).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (b[i], oct) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of this process's cgroup in the v1 hierarchy holding `controller`, or in
/// the v2 hierarchy when `controller` is `None`.
pub fn own_dir(controller: Option<&str>) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let lines = parse_cgroups(&cgroups);
    let line = lines.iter().find(|l| match controller {
        Some(c) => l.controllers.iter().any(|x| x == c),
        None => l.id == "0" && l.controllers.is_empty(),
    })?;
    cgroup_dir(line, &mountinfo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_hierarchy_mounted_from_a_sub_cgroup_resolves_below_its_mount() {
        let mounts = "\
30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 30 0:27 /nodes/n1 /mnt/node\\040mem rw - cgroup cgroup rw,cpu,cpuacct
50 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        let cg = parse_cgroups("4:memory:/a/b\n2:cpu,cpuacct:/nodes/n1/slurm/job_3\n0::/\n");
        assert_eq!(
            cgroup_dir(&cg[0], mounts),
            Some(Path::new("/sys/fs/cgroup/memory/a/b").to_path_buf())
        );
        assert_eq!(
            cgroup_dir(&cg[1], mounts),
            Some(Path::new("/mnt/node mem/slurm/job_3").to_path_buf())
        );
        assert_eq!(
            cgroup_dir(&cg[2], mounts),
            Some(Path::new("/sys/fs/cgroup/unified").to_path_buf())
        );
        // A hierarchy's own cgroup bound over its mount point is the one seen there.
        let over = format!(
            "{mounts}60 30 0:26 /nodes/n1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        );
        let node = parse_cgroups("4:memory:/nodes/n1/slurm_n1/job_3\n");
        assert_eq!(
            cgroup_dir(&node[0], &over),
            Some(Path::new("/sys/fs/cgroup/memory/slurm_n1/job_3").to_path_buf())
        );
        // A path outside the mount's root is not reachable through it.
        let other = parse_cgroups("2:cpu,cpuacct:/nodes/n2/x\n");
        assert_eq!(cgroup_dir(&other[0], mounts), None);
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
