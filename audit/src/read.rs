//! Reading records back (`vse audit`): from the site's audit file (one JSON object per line)
//! or from a syslog file, whose lines carry a record after the `vse-audit[PID]:` tag.

use crate::record::{Action, Record};
use crate::sink::SYSLOG_TAG;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Lines longer than this are not records (a record is at most 4000 bytes).
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("{}: {source}; hint: the site's audit file is its policy's audit.file; name another with --file", .path.display())]
pub struct ReadError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl vse_exit::Classify for ReadError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self.source.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                vse_exit::ErrorKind::InvalidInput
            }
            _ => vse_exit::ErrorKind::Internal,
        }
    }
}

/// Which records to keep.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub job: Option<String>,
    /// A user name or a uid.
    pub user: Option<String>,
    pub action: Option<Action>,
}

impl Filter {
    pub fn keeps(&self, r: &Record) -> bool {
        self.job.as_ref().is_none_or(|j| r.job.as_ref() == Some(j))
            && (self.user.as_ref()).is_none_or(|u| *u == r.user || *u == r.uid.to_string())
            && self.action.is_none_or(|a| a == r.action)
    }
}

/// The records a file holds that pass the filter, in file order, and how many lines that are
/// not records (other programs' syslog lines are not counted) were passed over.
#[derive(Debug, Default)]
pub struct Scan {
    pub records: Vec<Record>,
    pub unreadable: usize,
}

pub fn scan(path: &Path, filter: &Filter) -> Result<Scan, ReadError> {
    let err = |source| ReadError {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let mut out = Scan::default();
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = std::io::Read::take(&mut reader, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(err)?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            // Skip the rest of an overlong line.
            let mut rest = Vec::new();
            reader.read_until(b'\n', &mut rest).map_err(err)?;
            out.unreadable += 1;
            continue;
        }
        match parse_line(&String::from_utf8_lossy(&line)) {
            Some(Ok(r)) if filter.keeps(&r) => out.records.push(r),
            Some(Ok(_)) | None => {}
            Some(Err(())) => out.unreadable += 1,
        }
    }
    Ok(out)
}

/// `None`: not a record's line (blank, or another program's syslog line); `Some(Err)`: meant
/// as one but not a valid record.
fn parse_line(line: &str) -> Option<Result<Record, ()>> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let json = if line.starts_with('{') {
        line
    } else {
        let at = line.find(&format!(" {SYSLOG_TAG}"))?;
        let rest = &line[at..];
        &rest[rest.find('{')?..]
    };
    // A syslog daemon may append its own annotation (rsyslog's trusted properties).
    let mut records = serde_json::Deserializer::from_str(json).into_iter::<Record>();
    Some(records.next().map_or(Err(()), |r| r.map_err(|_| ())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Outcome;

    fn rec(job: &str, user: &str, uid: u32, action: &str) -> String {
        format!(
            r#"{{"time":"2026-11-29T12:00:00.000Z","action":"{action}","outcome":"allowed","user":"{user}","uid":{uid},"pid":7,"node":"n1","job":"{job}"}}"#
        )
    }

    #[test]
    fn records_are_read_from_the_site_file_and_from_syslog_lines() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.log");
        let text = [
            rec("j1", "alice", 1001, "launch"),
            String::new(),
            format!(
                "Nov 29 12:00:01 n1 vse-audit[99]: {} @[_PID=99 _UID=1002]",
                rec("j2", "bob", 1002, "evacuation")
            ),
            "Nov 29 12:00:02 n1 sshd[5]: Accepted publickey for bob".into(),
            "{not json".into(),
            rec("j1", "bob", 1002, "checkpoint"),
        ]
        .join("\n");
        std::fs::write(&f, text).unwrap();
        let all = scan(&f, &Filter::default()).unwrap();
        assert_eq!(all.records.len(), 3);
        assert_eq!(all.unreadable, 1);
        assert_eq!(all.records[1].action, Action::Evacuation);
        assert_eq!(all.records[1].outcome, Outcome::Allowed);
        let by = |f: Filter| -> Vec<String> {
            (scan(&d.path().join("a.log"), &f).unwrap().records.iter())
                .map(|r| format!("{}:{}", r.job.clone().unwrap(), r.action.as_str()))
                .collect()
        };
        assert_eq!(
            by(Filter {
                job: Some("j1".into()),
                ..Filter::default()
            }),
            ["j1:launch", "j1:checkpoint"]
        );
        assert_eq!(
            by(Filter {
                user: Some("1002".into()),
                action: Some(Action::Checkpoint),
                ..Filter::default()
            }),
            ["j1:checkpoint"]
        );
        assert_eq!(
            by(Filter {
                user: Some("bob".into()),
                ..Filter::default()
            }),
            ["j2:evacuation", "j1:checkpoint"]
        );
        let e = scan(&d.path().join("absent"), &Filter::default()).unwrap_err();
        assert!(e.to_string().contains("audit.file"), "{e}");
    }

    #[test]
    fn an_overlong_line_is_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.log");
        let long = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_LINE * 2));
        std::fs::write(&f, format!("{long}\n{}\n", rec("j", "u", 1, "sign"))).unwrap();
        let s = scan(&f, &Filter::default()).unwrap();
        assert_eq!((s.records.len(), s.unreadable), (1, 1));
    }
}
