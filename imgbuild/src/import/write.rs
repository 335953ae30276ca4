//! The import pipeline: open and verify the source, unpack its layers into a fresh rootfs,
//! check the policy against what it holds, add kernel, initramfs and guest agent, write the
//! ext4 root and the manifest. Everything happens in a temporary directory next to the output
//! that is renamed into place at the end, so a refused or failed import leaves nothing.

use super::blobs::{HashReader, Store};
use super::layers::{LayerStats, apply_layer};
use super::{ImportError, LayerRef, Source, dpkg, kernel};
use crate::build::{AGENT_IN_IMAGE, AgentBinary, CMDLINE};
use crate::customize::Customization;
use crate::deb::archive::LimitedReader;
use crate::deb::path::resolve_dir;
use crate::deb::{Kind, Meta, Records, RelPath};
use crate::fetch::{DebCache, hash_file};
use crate::plan::BuildPlan;
use crate::progress::{Event, Phase, Progress};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use vse_image::manifest::{
    Imported, ImportedLayer, KernelPackage, MANIFEST, MANIFEST_FORMAT, Manifest, Part,
};
use vsec::merge::images::{ImageFacts, InstalledPackage, check_import_allowed, check_imported};

#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub out_dir: PathBuf,
    pub cache_root: PathBuf,
    pub jobs: usize,
    pub agent: AgentBinary,
    /// Free space left on the root disk for jobs, MiB.
    pub free_mib: u64,
    /// Largest uncompressed size of one layer.
    pub layer_limit: u64,
    /// The architecture of the kernel: the image must match it.
    pub arch: String,
    /// `SOURCE_DATE_EPOCH` if set (the library never reads the environment).
    pub source_date_epoch: Option<String>,
    /// The policy stack to check the image against, if any.
    pub policy: Option<vsec::merge::Stack>,
    /// The files of that stack, recorded in the manifest.
    pub policies: Vec<vse_image::manifest::PolicyRef>,
}

impl ImportOptions {
    pub fn new(out_dir: PathBuf, agent: AgentBinary) -> Self {
        ImportOptions {
            out_dir,
            cache_root: DebCache::default_root(),
            jobs: 4,
            agent,
            free_mib: 256,
            layer_limit: 16 << 30,
            arch: "amd64".into(),
            source_date_epoch: None,
            policy: None,
            policies: vec![],
        }
    }
}

#[derive(Debug, Clone)]
pub struct ImportOutcome {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

fn builder_id() -> String {
    format!("imgbuild {}", env!("CARGO_PKG_VERSION"))
}

/// Imports `src` with the kernel and busybox of `kernel` (see [`super::kernel_plan`]).
pub fn import(
    src: &Source,
    kernel: &BuildPlan,
    opts: &ImportOptions,
    progress: &dyn Progress,
) -> Result<ImportOutcome, ImportError> {
    if let Some(st) = &opts.policy {
        let d = check_import_allowed(st, &src.given);
        if !d.is_empty() {
            return Err(ImportError::Policy(d));
        }
    }
    let sde = match &opts.source_date_epoch {
        Some(v) => Some(
            v.trim()
                .parse::<u64>()
                .map_err(|_| ImportError::SourceDateEpoch { value: v.clone() })?,
        ),
        None => None,
    };
    let agent = crate::build::check_agent(&opts.agent)?;
    let agent_sha256 = crate::fetch::sha256_hex(&agent);

    progress.event(Event::Phase(Phase::Verify));
    let desc = super::open_source(src, &opts.arch)?;
    let parent = opts
        .out_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ImportError::io(parent, e))?;
    let work = tempfile::Builder::new()
        .prefix(".vse-import-")
        .tempdir_in(parent)
        .map_err(|e| ImportError::io(parent, e))?;
    let (root, kroot, img) = (
        work.path().join("rootfs"),
        work.path().join("kernel"),
        work.path().join("image"),
    );
    for d in [&root, &kroot, &img] {
        std::fs::create_dir_all(d).map_err(|e| ImportError::io(d, e))?;
    }

    progress.event(Event::Phase(Phase::Layers));
    let mut records = Records::new();
    let dir = |perm| Meta {
        kind: Kind::Dir,
        perm,
        uid: 0,
        gid: 0,
    };
    records.insert("/".into(), dir(0o755));
    let mut layers = Vec::new();
    let mut max_mtime = 0;
    for (i, l) in desc.layers.iter().enumerate() {
        let (info, stats) = unpack_layer(&desc.store, l, i, &root, &mut records, opts)?;
        max_mtime = max_mtime.max(stats.max_mtime);
        progress.event(Event::Unpacked {
            name: format!("layer {} ({})", i + 1, info.diff_id),
        });
        layers.push(info);
    }
    let installed = dpkg::installed_packages(&root);
    if let Some(st) = &opts.policy {
        let facts = ImageFacts {
            dpkg_database: installed.is_some(),
            installed: installed
                .iter()
                .flatten()
                .map(|p| InstalledPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                    architecture: p.architecture.clone(),
                })
                .collect(),
            source: src.given.clone(),
        };
        let d = check_imported(st, &facts);
        if !d.is_empty() {
            return Err(ImportError::Policy(d.sorted()));
        }
    }
    // Fixed timestamps: the builder's wish, else when the image says it was made, else the
    // newest file of a plain tarball.
    let epoch = sde
        .or_else(|| {
            desc.config
                .created
                .as_deref()
                .and_then(super::oci::parse_rfc3339)
        })
        .unwrap_or(max_mtime);

    progress.event(Event::Phase(Phase::Fetch));
    let kver = kernel::unpack_kernel(kernel, &opts.cache_root, opts.jobs, &kroot, progress)?;

    progress.event(Event::Phase(Phase::Customize));
    // The agent runs as PID 1 and mounts these; a container image may lack some.
    for (d, perm) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("tmp", 0o1777),
    ] {
        let rel = RelPath::parse(d.as_bytes()).expect("literal");
        if std::fs::symlink_metadata(root.join(d)).is_err() {
            resolve_dir(&root, &rel, true).map_err(|e| ImportError::KernelPackage {
                package: "guest agent".into(),
                reason: e.to_string(),
            })?;
            records.insert(format!("/{d}"), dir(perm));
        }
    }
    crate::build::install_agent(&root, &mut records, agent)?;

    progress.event(Event::Phase(Phase::Initramfs));
    let initrd = img.join("initrd.img");
    let initramfs = crate::initramfs::build(&kroot, &kver, &initrd, epoch)?;
    let vmlinuz = img.join("vmlinuz");
    let vsrc = kernel::vmlinuz(&kroot, &kver);
    std::fs::copy(&vsrc, &vmlinuz).map_err(|e| ImportError::io(&vsrc, e))?;

    progress.event(Event::Phase(Phase::RootDisk));
    let raw = img.join("root.ext4");
    crate::disk::write_ext4(&root, &records, &raw, epoch, opts.free_mib)?;
    let mut parts = BTreeMap::new();
    for (key, path) in [("kernel", vmlinuz), ("initrd", initrd), ("root", raw)] {
        let (size, sha256) = hash_file(&path).map_err(|e| ImportError::io(&path, e))?;
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        parts.insert(key.to_string(), Part { file, size, sha256 });
    }
    let dpkg_database = installed.is_some();
    let installed = installed.unwrap_or_default();
    // A plain tarball is known by its own hash, computed while it was unpacked.
    let source_digest = match desc.source_digest.as_str() {
        "" => layers[0].digest.clone().unwrap_or_default(),
        d => d.to_string(),
    };
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        builder: builder_id(),
        lock_hash: kernel.lock_hash.clone(),
        customization_hash: Customization::default().hash(),
        epoch,
        kernel_version: kver,
        kernel_cmdline: CMDLINE.into(),
        root_format: "ext4".into(),
        root_uuid: crate::disk::ROOT_UUID.into(),
        root_label: crate::disk::ROOT_LABEL.into(),
        agent_path: AGENT_IN_IMAGE.into(),
        agent_sha256,
        packages: installed.len(),
        initramfs,
        parts,
        imported: Some(Imported {
            source_kind: src.kind.as_str().into(),
            source: src.given.clone(),
            source_digest,
            config_digest: desc.config_digest.clone(),
            layers,
            kernel_packages: kernel
                .packages
                .iter()
                .map(|p| KernelPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                    sha256: p.sha256.clone(),
                })
                .collect(),
            dpkg_database,
            installed,
        }),
        provenance: None,
        policies: opts.policies.clone(),
    };
    let mpath = img.join(MANIFEST);
    let json = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    std::fs::write(&mpath, json + "\n").map_err(|e| ImportError::io(&mpath, e))?;
    // The old image is removed only once the new one is whole.
    let old = work.path().join("old");
    if opts.out_dir.exists() {
        std::fs::rename(&opts.out_dir, &old).map_err(|e| ImportError::io(&opts.out_dir, e))?;
    }
    std::fs::rename(&img, &opts.out_dir).map_err(|e| ImportError::io(&opts.out_dir, e))?;
    drop(work);
    Ok(ImportOutcome {
        dir: opts.out_dir.clone(),
        manifest,
    })
}

/// Verifies (when the source names the stored digest), decompresses and applies one layer,
/// checking the uncompressed stream against its `diff_id`.
fn unpack_layer(
    store: &Store,
    l: &LayerRef,
    index: usize,
    root: &Path,
    records: &mut Records,
    opts: &ImportOptions,
) -> Result<(ImportedLayer, LayerStats), ImportError> {
    let index = index + 1;
    if let Some(d) = &l.digest {
        store.verify(&l.name, d, l.size)?;
    }
    let (r, _) = store.open(&l.name)?;
    let layer_err = |source| ImportError::Layer {
        index,
        layer: l.name.clone(),
        source,
    };
    let read_err = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            ImportError::LayerTooLarge {
                index,
                layer: l.name.clone(),
                limit: opts.layer_limit,
            }
        } else {
            layer_err(super::layers::LayerError::Read(e))
        }
    };
    let mut stored = HashReader::new(r);
    let (compression, diff, stats) = {
        let mut buf = BufReader::new(&mut stored);
        let magic = buf.fill_buf().map_err(read_err)?.to_vec();
        let (compression, dec): (&str, Box<dyn Read + '_>) = match magic.as_slice() {
            [0x1f, 0x8b, ..] => ("gzip", Box::new(flate2::read::MultiGzDecoder::new(buf))),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => (
                "zstd",
                Box::new(zstd::stream::read::Decoder::with_buffer(buf).map_err(read_err)?),
            ),
            [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => {
                ("xz", Box::new(xz2::read::XzDecoder::new(buf)))
            }
            _ => ("none", Box::new(buf)),
        };
        let mut diff = HashReader::new(LimitedReader::new(dec, opts.layer_limit));
        let stats = match apply_layer(&mut diff, root, records) {
            Ok(s) => s,
            Err(super::layers::LayerError::Read(e)) => return Err(read_err(e)),
            Err(e) => return Err(layer_err(e)),
        };
        // What follows the end-of-archive marker belongs to the digest too.
        let (diff, _) = diff.finish().map_err(read_err)?;
        (compression, diff, stats)
    };
    let (digest, size) = stored.finish().map_err(read_err)?;
    if let Some(want) = &l.diff_id
        && *want != diff
    {
        return Err(ImportError::DigestMismatch {
            what: format!("layer {index} ({}) uncompressed", l.name),
            expected: want.to_string(),
            found: diff.to_string(),
        });
    }
    Ok((
        ImportedLayer {
            digest: Some(l.digest.clone().unwrap_or(digest).to_string()),
            diff_id: diff.to_string(),
            compression: compression.into(),
            size,
        },
        stats,
    ))
}
