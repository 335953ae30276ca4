//! The validated spec: typed values, each with the position it was written at.

use crate::deb::{Arch, PackageName, Relation};
use crate::env::{CheckpointMode, FileEntry, Group, ShareSpec, User, Variant};
use crate::units::{ByteSize, Hypervisor, MirrorUrl, Seconds, Word};
use crate::yaml::{Loc, SrcPos};
use std::sync::Arc;

/// The only spec format this vse reads.
pub const SPEC_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub file: Arc<str>,
    pub name: Loc<Word>,
    pub description: Option<String>,
    pub base: BaseSpec,
    pub kernel: Option<Loc<PackageName>>,
    pub packages: Vec<Loc<Relation>>,
    pub files: Vec<Loc<FileEntry>>,
    pub groups: Vec<Loc<Group>>,
    pub users: Vec<Loc<User>>,
    /// In name order (YAML mappings are unordered).
    pub environment: Vec<(String, Loc<String>)>,
    pub post_install: Vec<Loc<String>>,
    pub vcpus: Option<Loc<u32>>,
    pub memory: Option<Loc<ByteSize>>,
    pub checkpoint: Option<CheckpointSpec>,
    pub hypervisor: Option<Loc<Hypervisor>>,
    /// Host directories to share into the guest, each at its item's line.
    pub shares: Vec<Loc<ShareSpec>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BaseSpec {
    pub distribution: Loc<Word>,
    pub suite: Loc<Word>,
    pub architecture: Option<Loc<Arch>>,
    pub components: Option<Loc<Vec<Loc<Word>>>>,
    pub mirror: Option<Loc<MirrorUrl>>,
    pub snapshot: Option<Loc<String>>,
    pub variant: Option<Loc<Variant>>,
    pub recommends: Option<Loc<bool>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSpec {
    pub mode: Loc<CheckpointMode>,
    pub interval: Option<Loc<Seconds>>,
}

impl Spec {
    /// Position for problems about the spec as a whole.
    pub fn start(&self) -> SrcPos {
        SrcPos::file_start(&self.file)
    }
}
