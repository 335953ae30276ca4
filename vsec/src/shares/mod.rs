//! Host directory shares: which host directories a job sees in its guests, and where. The
//! spec (`shares:`) and `vse launch --share` ask; the policies' `shares.allowed`,
//! `shares.forbidden` and `shares.default` decide. [`resolve`] runs on the host as the user,
//! once per job, so that `~`, the launch directory, `..` and symlinks are resolved once, by
//! the user's own view of the file system, before anything is handed to a node.

mod resolve;
mod rules;
mod syntax;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_launch;
#[cfg(test)]
mod tests_resolve;
#[cfg(test)]
mod tests_stack;

pub use resolve::resolve;
pub(crate) use rules::check_shares;
pub use rules::{ShareRules, check_spec};
pub use syntax::guest_path;
pub(crate) use syntax::{default_entry, host_path, mode, written};

/// A written absolute path with `.` and `..` taken away by name.
pub(crate) fn lexical_str(s: &str) -> String {
    syntax::lexical(std::path::Path::new(s))
        .to_string_lossy()
        .into_owned()
}

use crate::env::{EffectiveEnv, Origin, ShareSpec, Sourced};
use crate::yaml::SrcPos;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// Where a share was asked for, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareAt {
    /// An item of a spec's `shares:`.
    Spec(SrcPos),
    /// A `--share` argument, as given.
    Arg(String),
    /// A `shares.default` entry of a policy, or the built-in default.
    Default(Origin),
}

impl fmt::Display for ShareAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareAt::Spec(at) => write!(f, "{at}"),
            ShareAt::Arg(a) => write!(f, "--share {a}"),
            ShareAt::Default(Origin::Default) => f.write_str("the built-in default share (cwd)"),
            ShareAt::Default(o) => write!(f, "shares.default ({o})"),
        }
    }
}

/// One share asked for, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRequest {
    /// `~`, `~/x`, relative (to the launch directory) or absolute.
    pub host: String,
    /// `None`: the host path, made absolute (before symlinks are resolved).
    pub guest: Option<String>,
    pub ro: bool,
    pub at: ShareAt,
}

impl ShareRequest {
    pub fn from_spec(s: &Sourced<ShareSpec>) -> ShareRequest {
        let at = match &s.from {
            Origin::User { at } | Origin::Policy { at } => ShareAt::Spec(at.clone()),
            Origin::Default => ShareAt::Default(Origin::Default),
        };
        ShareRequest {
            host: s.value.host.clone(),
            guest: s.value.guest.as_ref().map(|g| g.to_string()),
            ro: s.value.ro,
            at,
        }
    }
}

/// The shares an effective environment's spec asks for.
pub fn spec_requests(env: &EffectiveEnv) -> Vec<ShareRequest> {
    env.shares.iter().map(ShareRequest::from_spec).collect()
}

/// A `--share HOST[:GUEST][:ro|:rw]` argument: the spec's string form.
pub fn parse_share_arg(arg: &str) -> Result<ShareRequest, ShareError> {
    let at = ShareAt::Arg(arg.to_string());
    match syntax::written(arg) {
        Ok(w) => Ok(ShareRequest {
            host: w.host,
            guest: w.guest.map(|g| g.to_string()),
            ro: w.ro,
            at,
        }),
        Err(e) => Err(ShareError::invalid(at, e)),
    }
}

/// What `~` and a relative path mean for this job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareContext {
    /// The launch directory.
    pub cwd: PathBuf,
    /// The user's home.
    pub home: PathBuf,
}

impl ShareContext {
    /// This process's directory and `$HOME`.
    pub fn from_process() -> std::io::Result<ShareContext> {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .ok_or_else(|| std::io::Error::other("HOME is unset or not an absolute path"))?;
        Ok(ShareContext {
            cwd: std::env::current_dir()?,
            home,
        })
    }
}

/// A share as the launcher mounts it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ResolvedShare {
    /// Canonical: absolute, no symlink, no `..`.
    pub host: PathBuf,
    /// Absolute, normalized, outside the guest's system directories.
    pub guest: String,
    pub ro: bool,
    /// One every job gets unasked (`shares.default`): a node that cannot see it (the launch
    /// directory on a node-local disk, say) leaves it out rather than failing the job.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// A share refused. Each names where it was asked for, and the policy line that refused it.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("{at}: {message}; hint: {hint}")]
    Invalid {
        at: ShareAt,
        message: String,
        hint: String,
    },
    #[error(
        "{at}: cannot share {}: no such directory; hint: create it first, or check the path (a relative one is from the launch directory, `~` is your home)",
        .host.display()
    )]
    Missing { at: ShareAt, host: PathBuf },
    #[error("{at}: cannot share {}: not a directory; hint: share the directory holding it", .host.display())]
    NotADirectory { at: ShareAt, host: PathBuf },
    #[error(
        "{at}: cannot share {}: you cannot read it ({reason}); hint: share a directory you can list and enter, or ask its owner for access",
        .host.display()
    )]
    Unreadable {
        at: ShareAt,
        host: PathBuf,
        reason: String,
    },
    #[error(
        "{at}: cannot share {}: it is under {prefix}, which shares.forbidden refuses ({rule}); hint: share another directory, this one is never shared",
        .host.display()
    )]
    Forbidden {
        at: ShareAt,
        host: PathBuf,
        prefix: String,
        rule: Box<Origin>,
    },
    #[error(
        "{at}: cannot share {}: it is under no directory of shares.allowed ({rule}: [{allowed}]); hint: share a directory under one of them",
        .host.display()
    )]
    NotAllowed {
        at: ShareAt,
        host: PathBuf,
        allowed: String,
        rule: Box<Origin>,
    },
    #[error(
        "{at}: cannot share {} read-write: shares.allowed gives {prefix} read-only ({rule}); hint: ask for it read-only (`:ro`, or `mode: ro` in a spec)",
        .host.display()
    )]
    ReadOnly {
        at: ShareAt,
        host: PathBuf,
        prefix: String,
        rule: Box<Origin>,
    },
    #[error(
        "{at}: guest path {guest} is already shared by {first}; hint: give one of them another guest path (HOST:GUEST)"
    )]
    SameGuest {
        at: ShareAt,
        guest: String,
        first: ShareAt,
    },
}

impl ShareError {
    fn invalid(at: ShareAt, e: crate::units::ValueError) -> ShareError {
        ShareError::Invalid {
            at,
            message: e.message,
            hint: e
                .hint
                .unwrap_or_else(|| "see `shares:` in the README".into()),
        }
    }

    /// The policy refused it (or its guest path): a default share of the launch directory
    /// is then left out rather than failing a job launched from anywhere.
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            ShareError::Invalid { .. }
                | ShareError::Unreadable { .. }
                | ShareError::Forbidden { .. }
                | ShareError::NotAllowed { .. }
        )
    }
}

impl vse_exit::Classify for ShareError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}
