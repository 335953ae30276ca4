//! `vse lock --check`: does an existing lock still match what resolving now gives?

use crate::lock::Lockfile;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockDifference {
    EnvHash {
        locked: String,
        now: String,
    },
    Added(String),
    Removed(String),
    Changed {
        name: String,
        locked: String,
        now: String,
    },
    Repositories,
}

impl fmt::Display for LockDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockDifference::EnvHash { locked, now } => write!(
                f,
                "the spec or a policy changed (environment hash {locked} in the lock, {now} now)"
            ),
            LockDifference::Added(p) => write!(f, "{p} would now be added"),
            LockDifference::Removed(p) => write!(f, "{p} would now be removed"),
            LockDifference::Changed { name, locked, now } => {
                write!(f, "{name}: locked {locked}, would now be {now}")
            }
            LockDifference::Repositories => write!(f, "the repositories' Release files changed"),
        }
    }
}

/// Differences between an existing lock and a fresh resolution (empty = up to date).
/// The generator line is ignored: a newer vse reading an equal lock is not a difference.
pub fn compare_locks(locked: &Lockfile, now: &Lockfile) -> Vec<LockDifference> {
    let mut out = Vec::new();
    if locked.env_hash != now.env_hash {
        out.push(LockDifference::EnvHash {
            locked: locked.env_hash.clone(),
            now: now.env_hash.clone(),
        });
    }
    let key = |p: &crate::lock::LockedPackage| format!("{}:{}", p.name, p.architecture);
    let old: std::collections::BTreeMap<String, _> =
        locked.packages.iter().map(|p| (key(p), p)).collect();
    let new: std::collections::BTreeMap<String, _> =
        now.packages.iter().map(|p| (key(p), p)).collect();
    for (k, p) in &new {
        match old.get(k) {
            None => out.push(LockDifference::Added(format!("{k} {}", p.version))),
            Some(o) if o.version != p.version || o.sha256 != p.sha256 => {
                out.push(LockDifference::Changed {
                    name: k.clone(),
                    locked: o.version.to_string(),
                    now: p.version.to_string(),
                })
            }
            Some(_) => {}
        }
    }
    for (k, p) in &old {
        if !new.contains_key(k) {
            out.push(LockDifference::Removed(format!("{k} {}", p.version)));
        }
    }
    if locked.repositories != now.repositories {
        out.push(LockDifference::Repositories);
    }
    out
}
