use super::{FetchError, ReleaseError, SourcesError, VerifyError};
use crate::index::IndexError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error(transparent)]
    Sources(#[from] SourcesError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error("{what}: {source}")]
    Release { what: String, source: ReleaseError },
    #[error(
        "{what}: the Release file expired on {valid_until} (checked at {checked_at}); the mirror is stale or replaying old data. Refresh the mirror, or allow it explicitly (`--allow-expired` / policy `allow-expired`)"
    )]
    Expired {
        what: String,
        valid_until: String,
        checked_at: String,
    },
    #[error("{what}: the Release file does not list `{path}` (wrong component or architecture?)")]
    MissingIndex { what: String, path: String },
    #[error(
        "{what}: hash mismatch: expected SHA256 {expected} and {expected_size} bytes, got {actual} and {actual_size} bytes (corrupted download, tampered mirror, or a mirror caught mid-sync)"
    )]
    HashMismatch {
        what: String,
        expected: String,
        expected_size: u64,
        actual: String,
        actual_size: u64,
    },
    #[error("{what}: cannot decompress: {message} (truncated or corrupted file?)")]
    Decompress { what: String, message: String },
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("{path}: not found in the apt lists directory; run `apt-get update` first")]
    NotInLists { path: PathBuf },
    #[error(
        "{what}: this archive offers no snapshots (its Release file has no `Snapshots:` field), so snapshot {snapshot} cannot be pinned; point a mirror rewrite at a snapshot mirror instead"
    )]
    NoSnapshot { what: String, snapshot: String },
    #[error("{what}: index is not UTF-8 text")]
    NotText { what: String },
}
