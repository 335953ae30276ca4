//! `vse import`: an image users already have (an OCI layout or archive, a `docker save`
//! archive, a rootfs tarball) made into a VSE image with the same layout and manifest as a
//! built one: its layers unpacked with the `.deb` extractor's path confinement and metadata
//! records (plus the OCI whiteout rules), every blob checked against its digest, a kernel and
//! initramfs from a lock, the guest agent, a reproducible ext4 root, and the provenance
//! (source, digests, the dpkg database's packages) in the manifest.

pub mod blobs;
mod docker;
pub mod dpkg;
pub mod kernel;
pub mod layers;
mod oci;
mod source;
mod write;

pub use kernel::{KernelError, kernel_plan};
pub use source::{Source, SourceKind};
pub use write::{ImportOptions, ImportOutcome, import};

use blobs::{Digest, Store};
use oci::ImageConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "{given:?} is not an image source; expected oci-archive:FILE[:TAG], oci:DIR[:TAG], docker-archive:FILE[:REPO:TAG] or tar:ROOTFS.tar[.gz|.zst|.xz]"
    )]
    SourceSyntax { given: String },
    #[error("{path}: does not exist; hint: check the path after `{kind}:`")]
    NotFound { kind: &'static str, path: PathBuf },
    #[error("{what}: {reason}")]
    Source { what: String, reason: String },
    #[error("{what} is missing; hint: the archive is incomplete (copy it again)")]
    Missing { what: String },
    #[error(
        "{what}: expected {expected} but found {found}; the source is corrupt or was tampered with"
    )]
    DigestMismatch {
        what: String,
        expected: String,
        found: String,
    },
    #[error("no image {wanted} in the source (it has: {available})")]
    NoSuchImage { wanted: String, available: String },
    #[error(
        "the image is for {found}, but its kernel is for {want}; hint: import the {want} variant of the image"
    )]
    Platform { found: String, want: String },
    #[error("layer {index} ({layer}): {source}")]
    Layer {
        index: usize,
        layer: String,
        source: layers::LayerError,
    },
    #[error("layer {index} ({layer}): unpacks to more than {limit} bytes; refusing")]
    LayerTooLarge {
        index: usize,
        layer: String,
        limit: u64,
    },
    #[error(
        "SOURCE_DATE_EPOCH={value:?} is not a number of seconds; hint: unset it or set e.g. SOURCE_DATE_EPOCH=1747699200"
    )]
    SourceDateEpoch { value: String },
    #[error("the image breaks the policy:\n{0}")]
    Policy(vsec::yaml::Diagnostics),
    #[error("kernel package {package}: {reason}")]
    KernelPackage { package: String, reason: String },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    #[error(transparent)]
    Deb(#[from] crate::deb::DebError),
    #[error(transparent)]
    Build(#[from] crate::build::BuildError),
    #[error(transparent)]
    Initramfs(#[from] crate::initramfs::InitramfsError),
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
    #[error(transparent)]
    Customize(#[from] crate::customize::CustomizeError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ImportError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ImportError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The source (or the arguments, or the policy) is at fault, not this host: exit code 2.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            ImportError::Io { .. }
                | ImportError::Fetch(_)
                | ImportError::Build(_)
                | ImportError::Initramfs(_)
                | ImportError::Disk(_)
                | ImportError::Customize(_)
                | ImportError::KernelPackage { .. }
                | ImportError::Deb(_)
        )
    }
}

/// One layer to apply, lowest first.
#[derive(Debug, Clone)]
pub(crate) struct LayerRef {
    /// File or member name in the store.
    pub name: String,
    /// Digest of the stored bytes, checked before unpacking.
    pub digest: Option<Digest>,
    pub size: Option<u64>,
    /// Digest of the uncompressed tar, checked while unpacking.
    pub diff_id: Option<Digest>,
}

/// An opened and verified source, ready to unpack.
#[derive(Debug)]
pub(crate) struct ImageDesc {
    pub store: Store,
    pub source_digest: String,
    pub config_digest: Option<String>,
    pub config: ImageConfig,
    pub layers: Vec<LayerRef>,
}

/// Opens and verifies the source's metadata (not yet its layers) and checks its platform.
pub(crate) fn open_source(src: &Source, arch: &str) -> Result<ImageDesc, ImportError> {
    let tag = src.reference.as_deref();
    let desc = match src.kind {
        SourceKind::Oci => oci::open(Store::Dir(src.path.clone()), tag, arch)?,
        SourceKind::OciArchive => oci::open(Store::tar(&src.path)?, tag, arch)?,
        SourceKind::DockerArchive => docker::open(Store::tar(&src.path)?, tag)?,
        SourceKind::Tar => {
            let dir = src.path.parent().filter(|p| !p.as_os_str().is_empty());
            let name = src.path.file_name().unwrap_or_default().to_string_lossy();
            ImageDesc {
                store: Store::Dir(dir.unwrap_or(Path::new(".")).to_path_buf()),
                source_digest: String::new(), // the tarball's hash, known once it is read
                config_digest: None,
                config: Default::default(),
                layers: vec![LayerRef {
                    name: name.into_owned(),
                    digest: None,
                    size: None,
                    diff_id: None,
                }],
            }
        }
    };
    let c = &desc.config;
    let found = format!(
        "{}/{}",
        c.os.as_deref().unwrap_or("linux"),
        c.architecture.as_deref().unwrap_or(arch)
    );
    if found != format!("linux/{arch}") {
        return Err(ImportError::Platform {
            found,
            want: format!("linux/{arch}"),
        });
    }
    Ok(desc)
}
