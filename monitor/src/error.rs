use std::path::PathBuf;

/// Everything that can go wrong while sampling or exporting.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {what}; expected {expected}")]
    Parse {
        path: String,
        line: usize,
        what: String,
        expected: &'static str,
    },
    #[error("guest view of VM {vm} unavailable: {reason}")]
    Guest { vm: String, reason: String },
    #[error("monitoring hook `{command}`: {reason}")]
    Hook { command: String, reason: String },
    #[error(
        "LDMS CSV schema `{schema}` has {expected} CPU columns but a sample has {got}; \
         hint: use one CSV writer per node type"
    )]
    CsvShape {
        schema: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}
