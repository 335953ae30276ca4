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
    #[error("{0}")]
    Unsafe(#[from] vse_base::Unsafe),
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
    #[error("cannot locate VM {vm} during recovery: {source}")]
    Locate {
        vm: String,
        source: super::recover::LocateError,
    },
    #[error(
        "cannot locate VM {vm} during recovery: it runs on {at}, neither source {source_node} \
         nor destination {dest}; hint: resolve by hand, then roll the migration back"
    )]
    Misplaced {
        vm: String,
        at: String,
        source_node: String,
        dest: String,
    },
}
