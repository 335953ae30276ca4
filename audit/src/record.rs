//! One audit record: a JSON object on one line.

use serde::{Deserialize, Serialize};

/// What was admitted or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Build,
    Import,
    Sign,
    Launch,
    Checkpoint,
    Restore,
    Migration,
    Evacuation,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Build,
        Action::Import,
        Action::Sign,
        Action::Launch,
        Action::Checkpoint,
        Action::Restore,
        Action::Migration,
        Action::Evacuation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Build => "build",
            Action::Import => "import",
            Action::Sign => "sign",
            Action::Launch => "launch",
            Action::Checkpoint => "checkpoint",
            Action::Restore => "restore",
            Action::Migration => "migration",
            Action::Evacuation => "evacuation",
        }
    }
}

impl std::str::FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Action::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Action::ALL.iter().map(|a| a.as_str()).collect();
                format!("unknown action `{s}`: expected one of {}", names.join(", "))
            })
    }
}

/// Whether the policies let the action go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Allowed,
    Refused,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Refused => "refused",
        }
    }
}

/// One policy file of the stack in force: where it was and the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRef {
    pub file: String,
    pub sha256: String,
}

impl PolicyRef {
    /// Each of `files` with the SHA-256 of its bytes now (`unreadable` when it cannot be read:
    /// the stack was read a moment ago, so the record still names the file).
    pub fn of_files(files: &[std::path::PathBuf]) -> Vec<PolicyRef> {
        use sha2::Digest;
        use std::io::Read;
        let digest = |p: &std::path::Path| -> std::io::Result<String> {
            let mut bytes = Vec::new();
            std::fs::File::open(p)?
                .take(16 << 20)
                .read_to_end(&mut bytes)?;
            Ok(hex::encode(sha2::Sha256::digest(&bytes)))
        };
        (files.iter())
            .map(|p| PolicyRef {
                file: std::path::absolute(p)
                    .unwrap_or_else(|_| p.clone())
                    .display()
                    .to_string(),
                sha256: digest(p).unwrap_or_else(|_| "unreadable".into()),
            })
            .collect()
    }
}

/// The digest a record names an image by: that of its manifest's bytes (`sha256:…`), which
/// lists the digest of every part.
pub fn image_digest(image: &std::path::Path) -> Option<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(image.join(vse_image::MANIFEST))
        .ok()?
        .take(vse_image::MAX_MANIFEST)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(&bytes))
    ))
}

/// What the acting code says about one action; [`crate::Auditor`] adds who, where and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub action: Action,
    pub outcome: Outcome,
    pub job: Option<String>,
    /// The image's manifest digest (`sha256:…`) or, before there is an image, its spec.
    pub image: Option<String>,
    /// For a refusal: the rule and the policy line, as the error names them.
    pub rule: Option<String>,
    /// What else identifies the action: the nodes of a migration, the output directory.
    pub detail: Option<String>,
}

impl Entry {
    pub fn allowed(action: Action) -> Entry {
        Entry {
            action,
            outcome: Outcome::Allowed,
            job: None,
            image: None,
            rule: None,
            detail: None,
        }
    }

    pub fn refused(action: Action, rule: impl Into<String>) -> Entry {
        Entry {
            outcome: Outcome::Refused,
            rule: Some(rule.into()),
            ..Entry::allowed(action)
        }
    }

    pub fn job(mut self, job: impl Into<String>) -> Entry {
        self.job = Some(job.into());
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Entry {
        self.detail = Some(detail.into());
        self
    }
}

/// The record as written and read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    pub action: Action,
    pub outcome: Outcome,
    pub user: String,
    pub uid: u32,
    pub pid: u32,
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One line for people: time, action, outcome, who, job, node, image, and the rule of a
/// refusal (else the detail).
impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
        let why = self.rule.as_ref().or(self.detail.as_ref());
        write!(
            f,
            "{} {:<10} {:<7} {}({}) job={} node={} image={} {}",
            self.time,
            self.action.as_str(),
            self.outcome.as_str(),
            self.user,
            self.uid,
            dash(&self.job),
            self.node,
            dash(&self.image),
            why.map_or("", String::as_str)
        )
    }
}
