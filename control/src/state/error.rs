#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("state database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("{what} `{name}` is not known to the controller; hint: {hint}")]
    NotFound {
        what: &'static str,
        name: String,
        hint: &'static str,
    },
    #[error("migration {id} is {state}, expected {expected}")]
    BadState {
        id: i64,
        state: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("state database holds an invalid value: {0}")]
    Corrupt(String),
    #[error("cannot locate VM {vm} during recovery: {reason}")]
    Locate { vm: String, reason: String },
}
