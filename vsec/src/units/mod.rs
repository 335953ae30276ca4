//! Validated newtypes for values in specs and policies: sizes, durations, paths, names,
//! URLs, hostname patterns. Each parses from the text a user writes and refuses anything
//! ambiguous with a hint.

pub mod duration;
pub mod names;
pub mod path;
pub mod size;

pub use duration::Seconds;
pub use names::{FileMode, HostnamePattern, Hypervisor, MirrorUrl, UnixName, Word};
pub use path::AbsPath;
pub use size::ByteSize;

/// Why a value was refused, and how to write it instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValueError {
    pub message: String,
    pub hint: Option<String>,
}

impl ValueError {
    pub fn new(message: impl Into<String>) -> Self {
        ValueError {
            message: message.into(),
            hint: None,
        }
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}
