//! The audit trail: who did what to which job and image, under which policies, and whether
//! the policies allowed it.
//!
//! Every action a site wants to account for (a build, an import, a signature, a launch, a
//! checkpoint, a restore, a migration, an evacuation) writes one [`Record`] **before** it
//! goes ahead: an admission (`allowed`) or a refusal (`refused`, with the rule and the policy
//! line that refused it). A record goes to syslog (facility `auth`, tag `vse-audit`), where
//! the daemon stamps the sender's credentials, and to the site's audit file when a site
//! policy names one (`audit.file`). An action whose record cannot reach the site's file does
//! not happen: an audit trail with holes is no audit trail. vse has no resident daemon, so a
//! record is written by the process that acts, as the user who acts.

mod read;
mod record;
mod sink;

pub use read::{Filter, ReadError, Scan, scan};
pub use record::{Action, Entry, Outcome, PolicyRef, Record, image_digest};
pub use sink::{AuditError, Auditor, SYSLOG_TAG};
