//! Reading untrusted `.deb` files: the ar container, compressed members, path-safe extraction.

pub mod ahead;
pub mod archive;
pub mod extract;
pub mod path;

pub use archive::{ControlFiles, DebError, DebFile, read_deb};
pub use extract::{ExtractError, Extracted, Kind, Meta, Records, extract_data, extract_entry};
pub use path::{PathError, RelPath};
