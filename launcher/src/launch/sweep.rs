//! What a killed front-end leaves behind, removed by the next one of the same user.

/// Removes the private directories (`vse-ctl-JOB-PID`) of this user's front-ends that were
/// killed before they could remove their own (a `vse attach` took over, or nothing did). A
/// directory whose process lives is left alone, whoever's it is.
pub(super) fn dead_front_ends(tmp: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = (name.to_str())
            .and_then(|n| n.strip_prefix("vse-ctl-"))
            .and_then(|rest| rest.rsplit('-').next())
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let ours =
            std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir() && Some(m.uid()) == me);
        if ours && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dead_front_end_s_directory_goes_and_a_live_one_s_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp
            .path()
            .join(format!("vse-ctl-job-x-{}", std::process::id()));
        // No process has this id (above the kernel's pid_max of 2^22).
        let dead = tmp.path().join("vse-ctl-job-y-4194305");
        let other = tmp.path().join("vse-ctl-notapid");
        for d in [&live, &dead, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("barrier.sock"), b"").unwrap();
        }
        super::dead_front_ends(tmp.path());
        assert!(live.exists() && other.exists());
        assert!(!dead.exists());
    }
}
