//! Why a node could not run a rank or move a VM. These travel to the front-end as text (in
//! `RankExited` and `MigrateMsg::Done`), so each message reads whole on one line.

use std::time::Duration;
use vse_exit::{Classify, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("the job is ending")]
    Ending,
    #[error(transparent)]
    Plugin(#[from] v2m::UnknownPlugin),
    #[error(transparent)]
    V2m(#[from] v2m::V2mError),
    #[error("the staged image: {0}")]
    Image(#[source] vse_image::ImageError),
    #[error("VM name: {0}")]
    VmName(#[source] v2m::names::NameError),
    #[error("the job's shared directories: {0}")]
    Shares(#[source] std::io::Error),
    #[error("VM id: {0}")]
    VmId(#[source] monitor::IdError),
    #[error(transparent)]
    Spec(#[from] vmhost::SpecError),
    #[error("the VM's network relay: {0}")]
    Relay(#[source] crate::net::NetError),
    #[error("MAC {mac}: {source}")]
    Mac {
        mac: String,
        #[source]
        source: v2m::names::NameError,
    },
    #[error(transparent)]
    Boot(#[from] vmhost::BootError),
    #[error(transparent)]
    Link(#[from] vse_guest_agent::LinkError),
    #[error("the VM's hypervisor (pid {0}) exited")]
    HypervisorExited(u32),
    #[error(
        "configuring the guest's job network (an image whose guest agent predates VM networking needs `vse build` again; or launch with --no-network): {0}"
    )]
    NetConfig(#[source] vse_guest_agent::LinkError),
    #[error("the VM migrated to another node")]
    MigratedAway,
    #[error("guest console (last lines):\n{console}: {source}")]
    WithConsole {
        console: String,
        #[source]
        source: Box<NodeError>,
    },
    #[error("VM {0} does not run a rank on this node")]
    NoRank(String),
    #[error("VM {0} is no longer running here")]
    Gone(String),
    #[error("the destination cannot take the VM: {0}")]
    Refused(String),
    #[error("unexpected {from}: {msg}")]
    Unexpected { from: &'static str, msg: String },
    #[error("no {what} within {after:?}")]
    NoReply { what: &'static str, after: Duration },
    #[error(transparent)]
    Migrate(#[from] vmhost::MigrateError),
    #[error("{what} {}: {source}", .path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: its SHA256 does not match the checkpoint's manifest (changed since it was verified)", .0.display())]
    Tampered(std::path::PathBuf),
}

/// A node's failure is its VM's, unless the host lacks a component (the hypervisor) or the
/// job is already over.
impl Classify for NodeError {
    fn kind(&self) -> ErrorKind {
        match self {
            NodeError::Plugin(e) => e.kind(),
            NodeError::V2m(e) => e.kind(),
            NodeError::Ending => ErrorKind::Internal,
            NodeError::WithConsole { source, .. } => source.kind(),
            NodeError::Boot(e @ vmhost::BootError::TooLarge(_)) => e.kind(),
            _ => ErrorKind::VmFailed,
        }
    }
}

impl NodeError {
    /// The whole chain on one line, for the front-end: a cause whose text the outer message
    /// already quotes is not repeated.
    pub fn describe(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let more = c.to_string();
            if !text.contains(&more) {
                text = format!("{text}: {more}");
            }
            cause = c.source();
        }
        text
    }
}
