//! Host directory shares as the effective environment carries them: what the spec asks for,
//! as written, and the policies' rules. Both are resolved on the host at launch
//! ([`crate::shares`]), where `~`, the launch directory and symlinks have a meaning.

use super::Sourced;
use crate::units::AbsPath;
use serde::Serialize;
use std::fmt;

/// One item of a spec's `shares:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShareSpec {
    /// As written: absolute, relative to the launch directory, or starting with `~`.
    pub host: String,
    /// `None`: the host path, once made absolute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<AbsPath>,
    pub ro: bool,
}

/// A `shares.allowed` entry: directories under `path` may be shared, read-only when `ro`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllowedShare {
    pub path: AbsPath,
    pub ro: bool,
}

/// What a `shares.default` entry shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultDir {
    /// The directory `vse launch` runs in.
    Cwd,
    /// The user's home.
    Home,
    Path(AbsPath),
}

/// A share every job gets without asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultShare {
    pub dir: DefaultDir,
    pub ro: bool,
}

impl DefaultShare {
    pub const CWD: DefaultShare = DefaultShare {
        dir: DefaultDir::Cwd,
        ro: false,
    };
}

/// The written form: `cwd`, `home`, `/scratch:ro`.
impl fmt::Display for DefaultShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.dir {
            DefaultDir::Cwd => f.write_str("cwd")?,
            DefaultDir::Home => f.write_str("home")?,
            DefaultDir::Path(p) => write!(f, "{p}")?,
        }
        if self.ro { f.write_str(":ro") } else { Ok(()) }
    }
}

impl Serialize for DefaultShare {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The policies' `shares:` rules, stacked.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SharePolicy {
    /// `None`: no policy restricts shares (any directory the user can read, read-write).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Sourced<Vec<Sourced<AllowedShare>>>>,
    /// `None`: the built-in default, the launch directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Sourced<Vec<Sourced<DefaultShare>>>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forbidden: Vec<Sourced<AbsPath>>,
}

impl SharePolicy {
    pub fn is_default(&self) -> bool {
        *self == SharePolicy::default()
    }
}
