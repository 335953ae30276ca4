//! Debian repository access: source definitions, fetching, OpenPGP verification of the
//! Release file, Valid-Until, SHA256/size checks of every index, decompression and a
//! content-hash cache. Produces verified, parsed `Packages` indices.
//!
//! Two kinds of location:
//! - [`Location::Remote`]: `http(s)://` or `file://` archive trees, fetched (by-hash where the
//!   Release says `Acquire-By-Hash: yes`) and cached by SHA256.
//! - [`Location::AptLists`]: the files apt already downloaded into `/var/lib/apt/lists`
//!   (the embedded default: the host's configured mirrors, read offline). They are verified
//!   exactly like remote files: signature, Valid-Until, SHA256 and size of the decompressed
//!   index against the signed Release.
//!
//! Snapshots: when the Release file offers a `Snapshots:` URL template (apt ≥ 2.7 archives),
//! the snapshot id replaces `@SNAPSHOTID@` and the archive is read from there; Valid-Until is
//! then checked against the snapshot time. Archives without it (bookworm's) cannot be pinned
//! in time by vse: the error says so and suggests a mirror rewrite to a snapshot mirror.

pub mod compress;
mod error;
pub mod fetch;
mod load;
pub mod release;
pub mod sources;
pub mod verify;

pub use error::RepoError;
pub use fetch::{Cache, FetchError, Fetcher, RetryPolicy};
pub use load::{
    LoadOptions, LoadedRepository, Location, ValidityCheck, VerifiedRelease, load_indices,
    load_repository, open_release,
};
pub use release::ReleaseError;
pub use sources::{SignedBy, SourceEntry, SourcesError, host_sources};
pub use verify::{Keyring, VerifyError};
