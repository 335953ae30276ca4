//! Finding a running job's state database from outside the job (`vse evacuate`): by the path
//! given, by the job's name under the run directory, or by looking at every job there. Only
//! jobs whose controller beats now count: a request to a finished job would wait forever.

use crate::state::StateDb;
use monitor::{JobId, NodeName};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FindJobError {
    #[error("no state database at {0}; hint: name the job's with --db, or the job with --job")]
    NoDb(PathBuf),
    #[error(
        "state database {db}: another user's job ({owner}); hint: only the job's owner acts on it (root does, as the owner)",
        db = .db.display()
    )]
    NotYours { db: PathBuf, owner: String },
    #[error(
        "state database {}: a symbolic link, which vse never follows to a database; hint: name the database itself",
        .0.display()
    )]
    Link(PathBuf),
    #[error("job {job} is not running (no live controller in {db}); hint: `vse status --db {db}`")]
    NotRunning { job: JobId, db: PathBuf },
    #[error("no running job has a node named {node}{among}; hint: `vse status` lists the nodes")]
    NoJob { node: NodeName, among: String },
    #[error("several running jobs have node {node}: {jobs}; hint: name one with --job")]
    Ambiguous { node: NodeName, jobs: String },
}

/// `db` is a state database this user may open: a file, not one in another user's run
/// directory (whose mode keeps even its name from others).
pub fn reachable(db: &Path) -> Result<(), FindJobError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(db) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) if m.is_symlink() => Err(FindJobError::Link(db.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // The nearest place this user may look at names the owner.
            let owner = (db.ancestors().skip(1))
                .find_map(|a| {
                    std::fs::metadata(a)
                        .ok()
                        .map(|m| (a.to_path_buf(), m.uid()))
                })
                .map_or_else(
                    || "permission denied".to_string(),
                    |(dir, uid)| format!("{} belongs to uid {uid}", dir.display()),
                );
            Err(FindJobError::NotYours {
                db: db.to_path_buf(),
                owner,
            })
        }
        _ => Err(FindJobError::NoDb(db.to_path_buf())),
    }
}

/// Every state database of `run_dir` (none when it does not exist); another user's run
/// directory is refused as theirs.
fn dbs_in(run_dir: &Path) -> Result<Vec<PathBuf>, FindJobError> {
    match std::fs::read_dir(run_dir) {
        Ok(d) => Ok(d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".state.db"))
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            reachable(&run_dir.join("x.state.db")).map(|()| Vec::new())
        }
        Err(_) => Ok(Vec::new()),
    }
}

/// The one running job (and its database) that `job` names, or that has `node`.
pub fn running_job(
    db: Option<&Path>,
    run_dir: &Path,
    job: Option<&JobId>,
    node: &NodeName,
) -> Result<(PathBuf, JobId), FindJobError> {
    let paths: Vec<PathBuf> = match (db, job) {
        (Some(p), _) => vec![p.to_path_buf()],
        (None, Some(j)) => vec![run_dir.join(format!("{j}.state.db"))],
        (None, None) => dbs_in(run_dir)?,
    };
    if let [only] = paths.as_slice() {
        reachable(only)?;
    }
    let now = crate::state::now_ms_u64();
    let mut found = Vec::new();
    for p in &paths {
        let Ok(sdb) = StateDb::open(p) else { continue };
        let live = sdb.live_jobs(now).unwrap_or_default();
        // A job named in a database of its own that is not live is an answer, not a miss.
        if let Some(j) = job
            && paths.len() == 1
            && !live.contains(j)
        {
            return Err(FindJobError::NotRunning {
                job: j.clone(),
                db: p.clone(),
            });
        }
        let has_node = sdb
            .nodes()
            .is_ok_and(|ns| ns.iter().any(|n| &n.name == node));
        for j in live.into_iter().filter(|l| job.is_none_or(|j| j == l)) {
            if has_node {
                found.push((p.clone(), j));
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(FindJobError::NoJob {
            node: node.clone(),
            among: match job {
                Some(j) => format!(" in job {j}"),
                None => format!(" (looked in {} database(s))", paths.len()),
            },
        }),
        _ => Err(FindJobError::Ambiguous {
            node: node.clone(),
            jobs: found
                .iter()
                .map(|(p, j)| format!("{j} ({})", p.display()))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The state database where job `job` runs now: the one given, else any of the run
/// directory's (a resumed job records in a database of its own, next to its first one's).
pub fn live_job(db: Option<&Path>, run_dir: &Path, job: &JobId) -> Result<PathBuf, FindJobError> {
    if let Some(p) = db {
        reachable(p)?;
    }
    let paths: Vec<PathBuf> = match db {
        Some(p) => vec![p.to_path_buf()],
        None => dbs_in(run_dir)?,
    };
    let now = crate::state::now_ms_u64();
    paths
        .iter()
        .find(|p| StateDb::open(p).is_ok_and(|s| s.live_jobs(now).is_ok_and(|l| l.contains(job))))
        .cloned()
        .ok_or_else(|| FindJobError::NotRunning {
            job: job.clone(),
            db: db.map_or_else(|| run_dir.to_path_buf(), Path::to_path_buf),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pool;

    fn job_db(dir: &Path, job: &str, node: &str, live: bool) -> PathBuf {
        let p = dir.join(format!("{job}.state.db"));
        let mut db = StateDb::open(&p).unwrap();
        let n = NodeName::new(node).unwrap();
        db.upsert_node(&n, Pool::Free).unwrap();
        let j = JobId::new(job).unwrap();
        db.add_vm(&j, &monitor::VmId::new(format!("{job}-r0")).unwrap(), &n, 1)
            .unwrap();
        if live {
            db.beat(&j, 1000).unwrap();
        }
        p
    }

    #[test]
    fn finds_the_one_running_job_with_the_node() {
        let d = tempfile::tempdir().unwrap();
        let a = job_db(d.path(), "ja", "n1", true);
        job_db(d.path(), "jb", "n2", true);
        job_db(d.path(), "jc", "n1", false);
        let n1 = NodeName::new("n1").unwrap();
        let (p, j) = running_job(None, d.path(), None, &n1).unwrap();
        assert_eq!((p, j.as_str()), (a.clone(), "ja"));
        let jc = JobId::new("jc").unwrap();
        let e = running_job(None, d.path(), Some(&jc), &n1).unwrap_err();
        assert!(matches!(e, FindJobError::NotRunning { .. }), "{e}");
        assert_eq!(
            live_job(None, d.path(), &JobId::new("ja").unwrap()).unwrap(),
            a
        );
        let e = live_job(None, d.path(), &jc).unwrap_err();
        assert!(matches!(e, FindJobError::NotRunning { .. }), "{e}");
        let e = running_job(None, d.path(), None, &NodeName::new("n9").unwrap()).unwrap_err();
        assert!(matches!(e, FindJobError::NoJob { .. }), "{e}");
        job_db(d.path(), "jd", "n1", true);
        let e = running_job(None, d.path(), None, &n1).unwrap_err();
        assert!(e.to_string().contains("name one with --job"), "{e}");
        let e = running_job(Some(&d.path().join("x.db")), d.path(), None, &n1).unwrap_err();
        assert!(matches!(e, FindJobError::NoDb(_)), "{e}");
    }
}
