//! The records the front-end writes for its job (see `vse-audit`): each checkpoint and each
//! migration, an evacuation's included, before it starts. A record that cannot be written
//! stops the checkpoint or the move; the job runs on.

use vse_audit::{Action, Auditor, Entry};

#[derive(Debug, Clone)]
pub(crate) struct JobAudit {
    auditor: Auditor,
    job: String,
}

impl JobAudit {
    pub(crate) fn new(auditor: Auditor, job: &str) -> JobAudit {
        JobAudit {
            auditor,
            job: job.to_string(),
        }
    }

    /// Writes the admission of `action` on this job; `Err` is the reason it must not happen.
    pub(crate) fn allow(&self, action: Action, detail: String) -> Result<(), String> {
        let entry = Entry::allowed(action).job(self.job.as_str()).detail(detail);
        self.auditor
            .log(entry)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
