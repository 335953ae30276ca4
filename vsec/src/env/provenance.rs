//! Where a value came from: the user's spec, a policy (which file and line), or a built-in
//! default. `vse check --explain` prints it; the env hash ignores it.

use crate::yaml::SrcPos;
use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Origin {
    /// Written in the spec.
    User { at: SrcPos },
    /// Imposed or filled in by a policy.
    Policy { at: SrcPos },
    /// Neither said anything: vse's built-in default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::User { at } => write!(f, "user {at}"),
            Origin::Policy { at } => write!(f, "policy {at}"),
            Origin::Default => f.write_str("default"),
        }
    }
}

/// A value and its origin. Serialized as `{"value": …, "from": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub from: Origin,
}

impl<T> Sourced<T> {
    pub fn user(value: T, at: SrcPos) -> Self {
        Sourced {
            value,
            from: Origin::User { at },
        }
    }
    pub fn policy(value: T, at: SrcPos) -> Self {
        Sourced {
            value,
            from: Origin::Policy { at },
        }
    }
    pub fn default(value: T) -> Self {
        Sourced {
            value,
            from: Origin::Default,
        }
    }

    /// No spec or policy set it: the built-in default.
    pub fn is_default(&self) -> bool {
        self.from == Origin::Default
    }
}
