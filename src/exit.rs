//! From the error that ended a command to its exit code: the first error of the chain whose
//! type says what kind of failure it is ([`Classify`]) picks the [`Exit`]; an error nobody
//! classified is internal. The codes themselves are defined and documented once, in the
//! `vse-exit` crate (`vse --help` prints its table).

use std::error::Error;
use std::fmt;
use std::process::ExitCode;
use vse_exit::{Classify, ErrorKind, Exit};

/// An error the binary raises itself (a bad argument, a file it was pointed at), or a
/// library error reworded with the command's context; either way it carries its kind.
#[derive(Debug)]
pub struct Failure {
    kind: ErrorKind,
    message: String,
}

impl Failure {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// The user's input is wrong (exit code 2).
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(ErrorKind::InvalidInput, message)
    }

    /// `e`'s kind under the caller's message, which normally quotes `e`.
    pub fn reword(e: &impl Classify, message: impl Into<String>) -> Self {
        Failure::new(e.kind(), message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Failure {}

impl Classify for Failure {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// A bad-input error for `?` in commands.
pub fn invalid(message: impl Into<String>) -> anyhow::Error {
    Failure::invalid(message).into()
}

/// The kind of one error of a chain, if its type is one of those the binary can meet.
fn kind_of(e: &(dyn Error + 'static)) -> Option<ErrorKind> {
    macro_rules! first_of {
        ($($t:ty),* $(,)?) => {
            $(if let Some(x) = e.downcast_ref::<$t>() {
                return Some(x.kind());
            })*
        };
    }
    first_of!(
        Failure,
        vsec::yaml::YamlError,
        vsec::yaml::Diagnostics,
        vsec::deb::RelationError,
        vsec::lock::LockError,
        vsec::resolve::ResolveError,
        vsec::launch::LaunchRuleError,
        vsec::shares::ShareError,
        vsec::site::SiteError,
        vsec::admit::AdmitError,
        vsec::admit::SignError,
        imgbuild::build::BuildError,
        imgbuild::disk::DiskError,
        imgbuild::from_lock::FromLockError,
        imgbuild::pipeline::PipelineError,
        imgbuild::pipeline::EnvError,
        v2m::V2mError,
        v2m::UnknownPlugin,
        vmhost::BootError,
        agents::alloc::AllocError,
        agents::agent::HostsError,
        agents::agent::UnknownRemote,
        launcher::ckpt::CkptError,
        launcher::ckpt::WalltimeError,
        launcher::launch::LaunchError,
        launcher::job::JobError,
        launcher::launch::RequestError,
        control::migrate::PolicyMapError,
        vse_base::Unsafe,
        bench::BenchError,
    );
    None
}

/// The user (or admin) can fix this: exit code 2.
pub fn is_invalid(err: &anyhow::Error) -> bool {
    exit_of(err) == Exit::InvalidInput
}

/// The exit code of a command that failed with `err`.
pub fn exit_of(err: &anyhow::Error) -> Exit {
    err.chain()
        .find_map(kind_of)
        .map_or(Exit::Internal, Exit::of)
}

/// Prints an error chain to stderr and picks the exit code. A cause whose text the lines
/// above already show (typed errors often quote their source) is not repeated.
pub fn report(err: &anyhow::Error) -> ExitCode {
    let mut shown = err.to_string();
    eprintln!("error: {shown}");
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if !shown.contains(&text) {
            eprintln!("  caused by: {text}");
            shown.push_str(&text);
        }
    }
    exit_of(err).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_classified_error_of_the_chain_picks_the_code() {
        let e = anyhow::Error::new(std::io::Error::other("disk on fire"));
        assert_eq!(exit_of(&e), Exit::Internal);
        let e = anyhow::Error::new(Failure::invalid("bad --vcpus")).context("launching");
        assert_eq!(exit_of(&e), Exit::InvalidInput);
        let missing = v2m::V2mError::BinaryNotFound {
            binary: "qemu-system-x86_64".into(),
            hint: "install it".into(),
        };
        let e = anyhow::Error::new(missing).context("booting");
        assert_eq!(exit_of(&e), Exit::InvalidInput);
        let e = anyhow::Error::new(Failure::new(ErrorKind::OutOfDate, "stale"));
        assert_eq!(exit_of(&e), Exit::OutOfDate);
    }

    #[test]
    fn the_readme_shows_the_exit_code_table() {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
        assert!(
            readme.contains(&Exit::markdown_table()),
            "README.md must show exactly:\n{}",
            Exit::markdown_table()
        );
    }
}
