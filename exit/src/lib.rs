//! The exit codes of `vse`, defined once. Libraries classify their errors with [`Classify`]
//! (an [`ErrorKind`], no I/O, no dependency on the binary); the binary maps the kind of the
//! error that ended a command to an [`Exit`]. `vse --help`, the README and the table below are
//! all generated from or checked against [`Exit::ALL`].
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | internal error: a bug, or the host failed (I/O, a crashed hypervisor) |
//! | 2 | invalid input (spec, policy, lock, image, arguments) or a missing system component |
//! | 3 | `vse lock SPEC --check`: the lockfile is out of date |
//! | 101 | `vse launch`: an agent or node failed; the job was torn down |
//! | 102 | `vse launch`: the image could not be staged to every node |
//! | 103 | `vse launch`: a VM could not boot or run the command |
//! | 104 | `vse evacuate`: no spare node can take the VMs; nothing was moved |
//! | 105 | `vse evacuate`: a move was refused or cancelled (destination, barrier deadline); the VM runs where it was |
//! | 106 | `vse launch`: the job was checkpointed and stopped (walltime end, preemption); run it again to resume |
//! | 107 | `vse checkpoint`: no checkpoint was taken (a VM could not be paused or saved); the job runs on |
//!
//! A command that runs a user's job (`vse run`, `vse launch`) exits with the job's own status
//! when the job ran; the launch codes sit above a shell's usual failure codes and below
//! 126/127/128+n.

#![forbid(unsafe_code)]

use std::fmt;

/// What kind of failure an error is, as far as the person who ran `vse` is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ErrorKind {
    /// The user's input is wrong: spec, policy, lockfile, image directory, arguments.
    InvalidInput,
    /// A program or service of the host that vse needs is missing (not installed, not
    /// running): the user or admin can fix that, so it is not an internal error.
    MissingComponent,
    /// A lockfile no longer matches what it was made from.
    OutOfDate,
    /// A bug, or the host failed us (I/O, a crashed hypervisor).
    Internal,
    /// An agent or node of a launch failed.
    NodeFailed,
    /// The image could not be staged to every node of a launch.
    StagingFailed,
    /// A VM of a launch could not be booted or did not run the command.
    VmFailed,
    /// No node has room for what was asked (an evacuation with no spare node).
    NoCapacity,
}

/// Implemented by the library errors the binary sees, so that it picks the exit code from the
/// error's type, never from its message.
pub trait Classify {
    fn kind(&self) -> ErrorKind;
}

/// The one list of exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    Internal = 1,
    InvalidInput = 2,
    OutOfDate = 3,
    NodeFailed = 101,
    StagingFailed = 102,
    VmFailed = 103,
    NoCapacity = 104,
    NotMoved = 105,
    Checkpointed = 106,
    NotCheckpointed = 107,
}

impl Exit {
    /// Every code, in increasing order: the documentation tables list exactly these.
    pub const ALL: [Exit; 11] = [
        Exit::Ok,
        Exit::Internal,
        Exit::InvalidInput,
        Exit::OutOfDate,
        Exit::NodeFailed,
        Exit::StagingFailed,
        Exit::VmFailed,
        Exit::NoCapacity,
        Exit::NotMoved,
        Exit::Checkpointed,
        Exit::NotCheckpointed,
    ];

    pub const fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Exit> {
        Exit::ALL.into_iter().find(|e| e.code() == code)
    }

    /// One line for the tables.
    pub const fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "success",
            Exit::Internal => {
                "internal error: a bug, or the host failed (I/O, a crashed hypervisor)"
            }
            Exit::InvalidInput => {
                "invalid input (spec, policy, lock, image, arguments) or a missing system component"
            }
            Exit::OutOfDate => "`vse lock SPEC --check`: the lockfile is out of date",
            Exit::NodeFailed => "`vse launch`: an agent or node failed; the job was torn down",
            Exit::StagingFailed => "`vse launch`: the image could not be staged to every node",
            Exit::VmFailed => "`vse launch`: a VM could not boot or run the command",
            Exit::NoCapacity => "`vse evacuate`: no spare node can take the VMs; nothing was moved",
            Exit::NotMoved => {
                "`vse evacuate`: a move was refused or cancelled (destination, barrier deadline); the VM runs where it was"
            }
            Exit::Checkpointed => {
                "`vse launch`: the job was checkpointed and stopped (walltime end, preemption); run it again to resume"
            }
            Exit::NotCheckpointed => {
                "`vse checkpoint`: no checkpoint was taken (a VM could not be paused or saved); the job runs on"
            }
        }
    }

    /// The exit code of an error of this kind.
    pub const fn of(kind: ErrorKind) -> Exit {
        match kind {
            ErrorKind::InvalidInput | ErrorKind::MissingComponent => Exit::InvalidInput,
            ErrorKind::OutOfDate => Exit::OutOfDate,
            ErrorKind::Internal => Exit::Internal,
            ErrorKind::NodeFailed => Exit::NodeFailed,
            ErrorKind::StagingFailed => Exit::StagingFailed,
            ErrorKind::VmFailed => Exit::VmFailed,
            ErrorKind::NoCapacity => Exit::NoCapacity,
        }
    }

    /// Plain-text table for `vse --help`.
    pub fn help_table() -> String {
        let mut s = String::from("Exit codes:\n");
        for e in Exit::ALL {
            s.push_str(&format!("  {:>3}  {}\n", e.code(), e.meaning()));
        }
        s.push_str(
            "Commands that run a job (`vse run`, `vse launch`) exit with its status when it ran.",
        );
        s
    }

    /// Markdown table, as in the README and this crate's documentation.
    pub fn markdown_table() -> String {
        let mut s = String::from("| code | meaning |\n|------|---------|\n");
        for e in Exit::ALL {
            s.push_str(&format!("| {} | {} |\n", e.code(), e.meaning()));
        }
        s
    }
}

impl From<ErrorKind> for Exit {
    fn from(kind: ErrorKind) -> Exit {
        Exit::of(kind)
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.code(), self.meaning())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_increasing_and_round_trip() {
        for w in Exit::ALL.windows(2) {
            assert!(w[0].code() < w[1].code());
        }
        for e in Exit::ALL {
            assert_eq!(Exit::from_code(e.code()), Some(e));
        }
        assert_eq!(Exit::from_code(4), None);
    }

    #[test]
    fn a_missing_component_is_fixable_input_not_an_internal_error() {
        assert_eq!(Exit::of(ErrorKind::MissingComponent), Exit::InvalidInput);
        assert_eq!(Exit::of(ErrorKind::InvalidInput).code(), 2);
        assert_eq!(Exit::of(ErrorKind::Internal).code(), 1);
        assert_eq!(Exit::of(ErrorKind::VmFailed).code(), 103);
    }

    #[test]
    fn the_crate_documentation_shows_the_generated_table() {
        let doc: String = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! "))
            .filter(|l| l.starts_with('|'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(doc, Exit::markdown_table());
    }
}
