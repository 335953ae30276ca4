//! Job checkpoints on disk: the manifest ([`manifest`]), the checkpoint directory with its
//! atomic publication and verification ([`store`]); the nodes write hashed sparse copies
//! (`vmhost::files`). Taking one is the front-end's (`launch::checkpoint`) and the nodes'
//! (`node::checkpoint`) work; when to take one is [`schedule`]'s.

pub mod manifest;
pub mod schedule;
pub mod setup;
pub mod store;

pub use manifest::{Cut, FileRecord, MANIFEST, Manifest, RankRecord, Reason, SavedVm};
pub use schedule::{Schedule, Walltime, WalltimeError};
pub use store::{Checkpoint, CheckpointDir, Partial, load, open};

use std::path::{Path, PathBuf};
use vse_exit::{Classify, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: not a checkpoint (no checkpoint.json, not a directory); hint: name the --checkpoint-dir of the job or one of its ckpt-N directories",
        .path.display()
    )]
    NotACheckpoint { path: PathBuf },
    #[error(
        "{}: holds no complete checkpoint; hint: a checkpoint is complete once its ckpt-N directory has a checkpoint.json",
        .dir.display()
    )]
    NoneComplete { dir: PathBuf },
    #[error(
        "{}: an incomplete checkpoint (its manifest was never written: the job or a node stopped while it was taken); hint: restore an earlier ckpt-N",
        .dir.display()
    )]
    Incomplete { dir: PathBuf },
    #[error(
        "{}: checkpoint file {file}: {why}; the checkpoint is damaged and is not restored (nothing was changed); hint: restore an earlier ckpt-N",
        .dir.display()
    )]
    Corrupt {
        dir: PathBuf,
        file: String,
        why: String,
    },
    #[error(
        "{}: checkpoint format {found}, this vse reads format {}; hint: restore it with the vse that wrote it",
        .dir.display(), manifest::FORMAT
    )]
    Format { dir: PathBuf, found: u32 },
    #[error("encoding the checkpoint manifest: {0}")]
    Encode(#[source] serde_json::Error),
}

impl CkptError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    fn corrupt(dir: &Path, file: &str, why: &str) -> Self {
        Self::Corrupt {
            dir: dir.to_path_buf(),
            file: file.to_string(),
            why: why.to_string(),
        }
    }
}

impl Classify for CkptError {
    fn kind(&self) -> ErrorKind {
        match self {
            CkptError::Encode(_) => ErrorKind::Internal,
            _ => ErrorKind::InvalidInput,
        }
    }
}
