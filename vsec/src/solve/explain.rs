//! Explanations for requests that cannot be satisfied.

use std::fmt;

/// Why one candidate could not be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Matches a forbidden pattern (the pattern and its origin).
    Forbidden(String),
    /// Another version of the same package is already chosen (with its chain).
    OtherVersionChosen(String),
    /// A chosen package (with its chain) conflicts with / breaks this one (the relation).
    ConflictedBy(String, String),
    /// This package conflicts with / breaks (the relation) a chosen one (with its chain).
    ConflictsWith(String, String),
    /// One of its dependencies has no candidate at all.
    MissingDependency(String),
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Forbidden(p) => write!(f, "{p}"),
            Rejection::OtherVersionChosen(o) => write!(f, "another version is chosen: {o}"),
            Rejection::ConflictedBy(by, rel) => {
                write!(f, "{by} declares Conflicts/Breaks `{rel}` against it")
            }
            Rejection::ConflictsWith(rel, o) => {
                write!(f, "it declares Conflicts/Breaks `{rel}`, which hits {o}")
            }
            Rejection::MissingDependency(g) => {
                write!(f, "its dependency `{g}` exists in no repository")
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub depth: usize,
    pub group: String,
    pub needed_by: String,
    pub rejected: Vec<(String, Rejection)>,
}

impl Failure {
    pub fn into_unsat(self) -> Unsatisfiable {
        Unsatisfiable {
            requirement: self.group,
            needed_by: self.needed_by,
            rejected: self.rejected,
        }
    }
}

/// The dead end the search got furthest into. Chains read `pkg <- dependent <- … (root)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsatisfiable {
    pub requirement: String,
    pub needed_by: String,
    pub rejected: Vec<(String, Rejection)>,
}

impl Unsatisfiable {
    /// True when the requirement failed only because of forbidden patterns.
    pub fn is_forbidden(&self) -> bool {
        !self.rejected.is_empty()
            && self
                .rejected
                .iter()
                .all(|(_, r)| matches!(r, Rejection::Forbidden(_)))
    }
}

impl fmt::Display for Unsatisfiable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unsatisfiable: `{}`, needed by {}",
            self.requirement, self.needed_by
        )?;
        if self.rejected.is_empty() {
            write!(
                f,
                ": no package of that name or providing it (with that version) exists"
            )?;
        }
        for (cand, why) in &self.rejected {
            write!(f, "\n  - {cand}: {why}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unsatisfiable {}
