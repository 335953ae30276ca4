//! Where records go: syslog always (when a daemon listens), the site's audit file when a
//! policy names one.

use crate::record::{Entry, PolicyRef, Record};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The syslog tag (program name) of every record; `vse audit` finds records in a syslog file
/// by it.
pub const SYSLOG_TAG: &str = "vse-audit";
/// The longest record. One `write(2)` of at most this many bytes to an `O_APPEND` file lands
/// whole, however many processes append at once, and syslog daemons take it in one message.
const MAX_LINE: usize = 4000;
/// What `rule` and `detail` keep at most, so that a record fits [`MAX_LINE`].
const MAX_TEXT: usize = 1200;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "audit file {} (the site policy's audit.file): {source}; the action is refused, since its record could not be written; hint: an admin creates the file (e.g. `install -o root -m 0622 /dev/null {}` in a root-owned directory)",
        .path.display(), .path.display()
    )]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "audit file {}: {reason}; the action is refused; hint: the audit file must be a regular file owned by root, in a directory owned by root that nobody else can write",
        .path.display()
    )]
    Unsafe { path: PathBuf, reason: String },
    #[error("audit file {}: writing the record: {source}; the action is refused", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A site's misconfigured audit file is for its admins to fix, not a bug of vse.
impl vse_exit::Classify for AuditError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::MissingComponent
    }
}

/// Writes the records of one process: who acts, where, under which policies.
#[derive(Debug, Clone)]
pub struct Auditor {
    file: Option<PathBuf>,
    policies: Vec<PolicyRef>,
    user: String,
    uid: u32,
    node: String,
}

impl Auditor {
    /// Records of the calling user (real uid) on this host, under `policies` (site first),
    /// also appended to `file` (the stack's `audit.file`) when there is one.
    pub fn new(file: Option<PathBuf>, policies: Vec<PolicyRef>) -> Auditor {
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        Auditor {
            file,
            policies,
            user: user_name(uid),
            uid,
            node: host_name(),
        }
    }

    /// The same auditor acting for `uid` (a node service that acts for a job's user).
    pub fn for_user(mut self, uid: u32) -> Auditor {
        self.user = user_name(uid);
        self.uid = uid;
        self
    }

    /// The site's audit file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Writes the record of `entry` and returns it. Only a failure of the site's file is an
    /// error (the caller then refuses the action); syslog is best effort, since a host without
    /// a syslog daemon would otherwise refuse everything.
    pub fn log(&self, entry: Entry) -> Result<Record, AuditError> {
        let mut record = self.record(entry);
        let mut line = serde_json::to_string(&record).unwrap_or_default();
        // Long texts and a long stack give way, in that order, so the record stays one write.
        if line.len() > MAX_LINE {
            record.detail = record.detail.map(|d| clip(d, 200));
            record.rule = record.rule.map(|r| clip(r, 600));
            for p in &mut record.policies {
                p.file = clip(std::mem::take(&mut p.file), 300);
            }
            record.policies.truncate(4);
            line = serde_json::to_string(&record).unwrap_or_default();
        }
        let _ = to_syslog(&line);
        if let Some(path) = &self.file {
            line.push('\n');
            append(path, line.as_bytes())?;
        }
        Ok(record)
    }

    fn record(&self, e: Entry) -> Record {
        let cut = |s: Option<String>| s.map(|s| clip(s, MAX_TEXT));
        Record {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            action: e.action,
            outcome: e.outcome,
            user: self.user.clone(),
            uid: self.uid,
            pid: std::process::id(),
            node: self.node.clone(),
            job: cut(e.job),
            image: cut(e.image),
            policies: self.policies.clone(),
            rule: cut(e.rule),
            detail: cut(e.detail),
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary, marked when cut.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

fn to_syslog(line: &str) -> Result<(), syslog::Error> {
    let f = syslog::Formatter3164 {
        facility: syslog::Facility::LOG_AUTH,
        hostname: None,
        process: SYSLOG_TAG.into(),
        pid: std::process::id(),
    };
    syslog::unix(f)?.info(line)
}

/// Appends `bytes` in one write. The file is never created or followed through a symlink, and
/// only a root-owned regular file in a root-owned directory nobody else can write is used:
/// whoever could replace it could point a root process's records anywhere.
fn append(path: &Path, bytes: &[u8]) -> Result<(), AuditError> {
    let unsafe_ = |reason: String| AuditError::Unsafe {
        path: path.to_path_buf(),
        reason,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let dmd = std::fs::symlink_metadata(dir).map_err(|source| AuditError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !dmd.is_dir() || dmd.uid() != 0 || dmd.mode() & 0o022 != 0 {
        return Err(unsafe_(format!(
            "its directory {} is not a directory owned by root that only root can write (owner uid {}, mode {:o})",
            dir.display(),
            dmd.uid(),
            dmd.mode() & 0o7777
        )));
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let md = f.metadata().map_err(|source| AuditError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !md.is_file() || md.uid() != 0 {
        return Err(unsafe_(format!(
            "not a regular file owned by root (owner uid {})",
            md.uid()
        )));
    }
    let n = f.write(bytes).map_err(|source| AuditError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    if n != bytes.len() {
        return Err(AuditError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::WriteZero, "the record was cut"),
        });
    }
    Ok(())
}

/// The account name of `uid`, or the number when the host has no name for it.
fn user_name(uid: u32) -> String {
    vse_base::account::passwd(uid).map_or_else(|| uid.to_string(), |p| p.name)
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Action, Outcome};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_record_names_who_where_and_what() {
        let a = Auditor::new(
            None,
            vec![PolicyRef {
                file: "/etc/vse/policy.d/site.policy.yaml".into(),
                sha256: "ab".repeat(32),
            }],
        );
        let r = a
            .log(
                Entry::refused(Action::Launch, "site.policy.yaml:4:3: limits.max_vcpus = 2")
                    .job("j1"),
            )
            .unwrap();
        assert_eq!(r.action, Action::Launch);
        assert_eq!(r.outcome, Outcome::Refused);
        // SAFETY: getuid cannot fail.
        assert_eq!(r.uid, unsafe { libc::getuid() });
        assert!(!r.user.is_empty() && !r.node.is_empty());
        assert_eq!(r.job.as_deref(), Some("j1"));
        assert!(r.time.ends_with('Z') && r.time.len() == 24, "{}", r.time);
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains("\"outcome\":\"refused\"") && line.contains("\"action\":\"launch\""));
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    }

    #[test]
    fn long_text_is_cut_so_a_record_stays_one_write() {
        let many = (0..20)
            .map(|i| PolicyRef {
                file: format!("/{}/{i}.policy.yaml", "p".repeat(2000)),
                sha256: "ab".repeat(32),
            })
            .collect();
        let r = Auditor::new(None, many)
            .log(Entry::refused(Action::Launch, "r".repeat(5000)).detail("d".repeat(5000)))
            .unwrap();
        assert!(serde_json::to_string(&r).unwrap().len() < MAX_LINE, "{r:?}");
        assert_eq!(r.policies.len(), 4);
        let a = Auditor::new(None, Vec::new());
        let r = a
            .log(Entry::allowed(Action::Build).detail("é".repeat(5000)))
            .unwrap();
        let d = r.detail.clone().unwrap();
        assert!(d.len() <= MAX_TEXT + '…'.len_utf8() && d.ends_with('…'));
        assert!(serde_json::to_string(&r).unwrap().len() < MAX_LINE);
    }

    #[test]
    fn only_a_root_owned_file_in_a_root_owned_directory_is_appended_to() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("audit.jsonl");
        let a = Auditor::new(Some(file.clone()), Vec::new());
        // Never created by vse: the site makes it.
        let e = a.log(Entry::allowed(Action::Sign)).unwrap_err();
        assert!(matches!(e, AuditError::Open { .. }), "{e}");
        std::fs::write(&file, b"").unwrap();
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            a.log(Entry::allowed(Action::Sign)).unwrap();
            a.log(Entry::refused(Action::Build, "r")).unwrap();
            let text = std::fs::read_to_string(&file).unwrap();
            assert_eq!(text.lines().count(), 2, "{text}");
            // A directory others can write lets them swap the file: refused.
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            let e = a.log(Entry::allowed(Action::Sign)).unwrap_err();
            assert!(e.to_string().contains("only root can write"), "{e}");
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            // A symlink is not followed.
            let link = d.path().join("link.jsonl");
            std::os::unix::fs::symlink(&file, &link).unwrap();
            let e = Auditor::new(Some(link), Vec::new())
                .log(Entry::allowed(Action::Sign))
                .unwrap_err();
            assert!(matches!(e, AuditError::Open { .. }), "{e}");
        } else {
            let e = a.log(Entry::allowed(Action::Sign)).unwrap_err();
            assert!(e.to_string().contains("owned by root"), "{e}");
        }
    }
}
