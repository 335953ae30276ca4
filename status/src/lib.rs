//! `vse status --serve`: a live page of the controller's state — a heat map of the nodes
//! coloured by their Active-memory ratio (the failure rule's input) with a sparkline of
//! recent samples in each cell, the VMs on each node, the pools, and the migration timeline
//! with arrows from source to destination — plus the same data as JSON (`/api/status`), a
//! server-sent event stream of changes (`/api/events`) and the Prometheus text of the latest
//! samples (`/metrics`).
//!
//! The page is plain HTML, CSS and JavaScript with inline SVG, embedded in the binary; it
//! arrives with the current snapshot inside (so it renders with no request of its own) and
//! then follows the event stream, falling back to polling. Loopback needs nothing when the
//! DB is the caller's own; any other address, or another account's DB, needs a token, and
//! every request must name this server in `Host` ([`auth`]).

pub mod auth;
mod listen;
mod server;
pub mod snapshot;

pub use server::{ServeOptions, serve_blocking};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Bad arguments: exit code 2.
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state database: {0}")]
    Db(#[from] control::state::ControllerError),
}

impl StatusError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StatusError {
        let what = what.into();
        move |source| StatusError::Io { what, source }
    }
}
