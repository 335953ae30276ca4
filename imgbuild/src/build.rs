//! The build pipeline. Everything is made in a temporary directory next to the output and
//! renamed into place at the end, so an interrupted or failed build never leaves an image
//! that looks complete; an unchanged plan is a cache hit that touches nothing.

use crate::accounts::AccountError;
use crate::customize::{Customization, CustomizeError};
use crate::deb::{Kind, Meta};
use crate::disk::{self, DiskError};
use crate::fetch::{DebCache, FetchError, hash_file};
use crate::initramfs::{self, InitramfsError};
use crate::layers::base::BaseError;
use crate::plan::BuildPlan;
use crate::progress::{Event, Phase, Progress};
use crate::rootfs::RootfsError;
use crate::rootfs::chroot::ChrootError;
use crate::rootfs::inroot::InRoot;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vse_image::manifest::{PackageRef, Provenance};
use vse_image::{MANIFEST, MANIFEST_FORMAT, Manifest, Part};

/// Where the guest agent lives in every image (the initramfs hands over to it).
pub const AGENT_IN_IMAGE: &str = "/usr/lib/vse/vse-agent";
/// Kernel command line: serial console first (every hypervisor has one), no reboot loop.
pub const CMDLINE: &str = "console=ttyS0 panic=-1 quiet";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the lock has no packages")]
    Empty,
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Customize(#[from] CustomizeError),
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error(transparent)]
    Base(#[from] BaseError),
    #[error(
        "no kernel in the image: {0}; hint: the spec must name a kernel package (e.g. linux-image-cloud-amd64)"
    )]
    NoKernel(String),
    #[error(
        "guest agent {from}: {reason}; hint: drop --agent to use the agent built into vse, or point it at a static vse-guest-agent"
    )]
    Agent { from: String, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Rootless(#[from] crate::rootless::RootlessError),
}

/// Problems of the lock, the spec or `--agent` are the user's input; a missing host tool is a
/// missing component; everything else (downloads, scripts, I/O) failed on the host.
impl vse_exit::Classify for BuildError {
    fn kind(&self) -> vse_exit::ErrorKind {
        use vse_exit::ErrorKind;
        match self {
            BuildError::Empty | BuildError::NoKernel(_) | BuildError::Agent { .. } => {
                ErrorKind::InvalidInput
            }
            BuildError::Disk(d) => d.kind(),
            BuildError::Rootless(r) => r.kind(),
            BuildError::Fetch(FetchError::Unsafe(u)) => u.kind(),
            // The spec's own commands broke the policy.
            BuildError::Customize(CustomizeError::PolicyViolated { .. }) => ErrorKind::InvalidInput,
            // The spec's accounts cannot be made as written in this image.
            BuildError::Customize(CustomizeError::Accounts(
                AccountError::Differs { .. } | AccountError::NoGroup { .. },
            )) => ErrorKind::InvalidInput,
            // The site's choice of the sandbox's host ids is unusable on this host.
            BuildError::Customize(CustomizeError::Chroot(ChrootError::Prepare { .. }))
            | BuildError::Rootfs(RootfsError::Chroot(ChrootError::Prepare { .. }))
            | BuildError::Base(BaseError::Rootfs(RootfsError::Chroot(ChrootError::Prepare {
                ..
            }))) => ErrorKind::InvalidInput,
            BuildError::Fetch(_)
            | BuildError::Rootfs(_)
            | BuildError::Customize(_)
            | BuildError::Initramfs(_)
            | BuildError::Base(_)
            | BuildError::Io { .. } => ErrorKind::Internal,
        }
    }
}

/// The static guest agent to bake into an image: a file, or bytes its caller carries (the
/// `vse` binary embeds the agent built with it, so an installed `vse` needs no second file).
#[derive(Debug, Clone)]
pub enum AgentBinary {
    File(PathBuf),
    Embedded(&'static [u8]),
}

/// No agent: what a deserialized [`BuildOptions`] holds until its owner sets one (the build
/// refuses it as not an executable).
impl Default for AgentBinary {
    fn default() -> Self {
        AgentBinary::Embedded(&[])
    }
}

impl From<PathBuf> for AgentBinary {
    fn from(p: PathBuf) -> Self {
        AgentBinary::File(p)
    }
}

impl AgentBinary {
    fn describe(&self) -> String {
        match self {
            AgentBinary::File(p) => p.display().to_string(),
            AgentBinary::Embedded(_) => "built into vse".into(),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BuildOptions {
    pub out_dir: PathBuf,
    pub cache_root: PathBuf,
    pub qcow2: bool,
    pub tar: bool,
    /// Parallel downloads.
    pub jobs: usize,
    /// The static guest agent binary to bake in.
    #[serde(skip)]
    pub agent: AgentBinary,
    pub customization: Customization,
    /// Free space left on the root disk for jobs, MiB.
    pub free_mib: u64,
    /// Largest uncompressed data tarball accepted per package.
    pub data_limit: u64,
    /// Where configured roots are kept between builds (`None`: always build clean).
    pub layer_cache: Option<PathBuf>,
    /// The policy stack the customisation came from, recorded in the manifest.
    pub policies: Vec<vse_image::manifest::PolicyRef>,
}

impl BuildOptions {
    pub fn new(out_dir: PathBuf, agent: impl Into<AgentBinary>) -> Self {
        BuildOptions {
            out_dir,
            cache_root: DebCache::default_root(),
            qcow2: false,
            tar: false,
            jobs: 6,
            agent: agent.into(),
            customization: Customization::default(),
            free_mib: 256,
            data_limit: 4 << 30,
            layer_cache: Some(crate::layers::LayerStore::default_dir()),
            policies: vec![],
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BuildOutcome {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Nothing was rebuilt: the output already matched the plan.
    pub cache_hit: bool,
    /// The layer store could not be used or written (the build went on without it).
    pub layer_note: Option<String>,
    /// How the configured root was obtained (`None`: a cache hit built nothing).
    pub root: Option<crate::layers::base::RootSource>,
    /// Where the build's time went, phase by phase (empty for a cache hit).
    #[serde(default)]
    pub phases: Vec<crate::progress::PhaseTime>,
}

/// The builder's identity in manifests and layer keys.
pub fn builder_id() -> String {
    format!("imgbuild {}", env!("CARGO_PKG_VERSION"))
}

/// Builds the image of `plan` into `opts.out_dir`: in a scratch directory next to it, renamed
/// into place only when whole, so an interrupted build never leaves an image that looks done.
pub fn build(
    plan: &BuildPlan,
    opts: &BuildOptions,
    progress: &dyn Progress,
) -> Result<BuildOutcome, BuildError> {
    if plan.packages.is_empty() {
        return Err(BuildError::Empty);
    }
    let custom_hash = opts.customization.hash();
    let agent = check_agent(&opts.agent)?;
    let agent_sha256 = crate::fetch::sha256_hex(&agent);
    if let Some(hit) = cache_hit(plan, opts, &custom_hash, &agent_sha256) {
        return Ok(hit);
    }
    let clock = crate::progress::PhaseClock::new(progress);
    clock.event(Event::Phase(Phase::Fetch));
    let paths = fetch(plan, opts, &clock)?;
    let mut outcome = if crate::rootless::needed() {
        crate::rootless::build_in_userns(plan, opts, &paths, &clock)?
    } else {
        build_fetched(plan, opts, &paths, &clock)?
    };
    outcome.phases = clock.finish();
    Ok(outcome)
}

/// [`build`] once every `.deb` is fetched: as root, or as the root of the user namespace of a
/// rootless build.
pub fn build_fetched(
    plan: &BuildPlan,
    opts: &BuildOptions,
    paths: &[crate::deb::DebFile],
    progress: &dyn Progress,
) -> Result<BuildOutcome, BuildError> {
    let custom_hash = opts.customization.hash();
    let agent = check_agent(&opts.agent)?;
    let agent_sha256 = crate::fetch::sha256_hex(&agent);
    let parent = opts
        .out_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    sweep_scratch(parent);
    let work = tempfile::Builder::new()
        .prefix(SCRATCH)
        .tempdir_in(parent)
        .map_err(io(parent))?;
    // Held until this function returns: a scratch directory nobody holds is a dead build's.
    let _live = std::fs::File::open(work.path())
        .and_then(|f| f.try_lock().map(|()| f).map_err(std::io::Error::other))
        .map_err(io(work.path()))?;
    let root = work.path().join("rootfs");
    let img = work.path().join("image");
    std::fs::create_dir_all(&root).map_err(io(&root))?;
    std::fs::create_dir_all(&img).map_err(io(&img))?;

    let base = configured_root(plan, opts, &root, paths, progress)?;
    let mut records = base.records;

    progress.event(Event::Phase(Phase::Customize));
    install_agent(&root, &mut records, agent)?;
    opts.customization
        .apply(&root, &mut records, plan.epoch, progress)?;

    let Boot {
        kver,
        initramfs,
        vmlinuz,
        initrd,
        raw,
    } = boot_and_disk(&root, &records, &img, plan, opts, progress)?;
    let mut files: Vec<(&str, PathBuf)> = vec![
        ("kernel", vmlinuz),
        ("initrd", initrd),
        ("root", raw.clone()),
    ];
    files.extend(extras(&root, &records, &raw, &img, plan, opts, progress)?);
    progress.event(Event::Phase(Phase::Manifest));
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        builder: builder_id(),
        lock_hash: plan.lock_hash.clone(),
        customization_hash: custom_hash,
        epoch: plan.epoch,
        kernel_version: kver,
        kernel_cmdline: CMDLINE.into(),
        root_format: "ext4".into(),
        root_uuid: disk::ROOT_UUID.into(),
        root_label: disk::ROOT_LABEL.into(),
        agent_path: AGENT_IN_IMAGE.into(),
        agent_sha256: agent_sha256.clone(),
        packages: plan.packages.len(),
        initramfs,
        parts: parts(files)?,
        imported: None,
        provenance: Some(Provenance {
            layer: base.layer.clone(),
            packages: plan
                .packages
                .iter()
                .map(|p| PackageRef {
                    name: p.name.clone(),
                    version: p.version.clone(),
                    sha256: p.sha256.clone(),
                })
                .collect(),
            steps: opts.customization.steps(&agent_sha256),
        }),
        policies: opts.policies.clone(),
    };
    let mpath = img.join(MANIFEST);
    let json = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    std::fs::write(&mpath, json + "\n").map_err(io(&mpath))?;

    // Swap the finished image in; the old one is removed only once the new one is whole.
    let old = work.path().join("old");
    if opts.out_dir.exists() {
        std::fs::rename(&opts.out_dir, &old).map_err(io(&opts.out_dir))?;
    }
    std::fs::rename(&img, &opts.out_dir).map_err(io(&opts.out_dir))?;
    discard(work);
    Ok(BuildOutcome {
        dir: opts.out_dir.clone(),
        manifest,
        cache_hit: false,
        layer_note: base.note,
        root: Some(base.source),
        phases: Vec::new(),
    })
}

/// The image's kernel, initramfs and root disk, made by [`boot_and_disk`].
struct Boot {
    kver: String,
    initramfs: vse_image::manifest::InitramfsInfo,
    vmlinuz: PathBuf,
    initrd: PathBuf,
    raw: PathBuf,
}

/// Writes the root disk, and the kernel and initramfs meanwhile: `mke2fs` keeps one core
/// busy for about a second, so the initramfs is made on another (both only read `root`).
fn boot_and_disk(
    root: &Path,
    records: &crate::deb::Records,
    img: &Path,
    plan: &BuildPlan,
    opts: &BuildOptions,
    progress: &dyn Progress,
) -> Result<Boot, BuildError> {
    progress.event(Event::Phase(Phase::RootDisk));
    let kver = find_kernel(root, plan)?;
    let (vmlinuz, initrd, raw) = (
        img.join("vmlinuz"),
        img.join("initrd.img"),
        img.join("root.ext4"),
    );
    let (disk, initramfs) = std::thread::scope(|s| {
        let disk = s.spawn(|| disk::write_ext4(root, records, &raw, plan.epoch, opts.free_mib));
        let boot = (|| {
            let info = initramfs::build(root, &kver, &initrd, plan.epoch)?;
            // Untrusted commands ran in the root: nothing read from it may follow a link out.
            let src = format!("boot/vmlinuz-{kver}");
            InRoot::open(root)
                .and_then(|r| r.copy_to(&src, &vmlinuz))
                .map_err(io(&root.join(&src)))?;
            Ok::<_, BuildError>(info)
        })();
        let disk = disk.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (disk, boot)
    });
    let initramfs = initramfs?;
    disk?;
    Ok(Boot {
        kver,
        initramfs,
        vmlinuz,
        initrd,
        raw,
    })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + use<> {
    let path = path.to_path_buf();
    move |source| BuildError::Io { path, source }
}

/// The image already in `opts.out_dir`, when it is whole and was built from the same plan,
/// customization, agent, builder and options.
fn cache_hit(
    plan: &BuildPlan,
    opts: &BuildOptions,
    custom_hash: &str,
    agent_sha256: &str,
) -> Option<BuildOutcome> {
    let m = Manifest::read(&opts.out_dir)?;
    let same = m.lock_hash == plan.lock_hash
        && m.agent_sha256 == agent_sha256
        && m.customization_hash == custom_hash
        && m.policies == opts.policies
        && m.builder == builder_id()
        && m.epoch == plan.epoch
        && m.parts.contains_key("qcow2") == opts.qcow2
        && m.parts.contains_key("tar") == opts.tar
        && m.parts_present(&opts.out_dir);
    same.then(|| BuildOutcome {
        dir: opts.out_dir.clone(),
        manifest: m,
        cache_hit: true,
        layer_note: None,
        root: None,
        phases: Vec::new(),
    })
}

/// Every `.deb` of the plan, from the download cache (fetched and verified when missing).
fn fetch(
    plan: &BuildPlan,
    opts: &BuildOptions,
    progress: &dyn Progress,
) -> Result<Vec<crate::deb::DebFile>, BuildError> {
    let cache = DebCache::open(&opts.cache_root)?;
    let wants = plan.wants();
    Ok(cache.fetch_all(&wants, opts.jobs, progress)?)
}

/// Every package unpacked and configured in `root`: from a kept layer when one fits.
fn configured_root(
    plan: &BuildPlan,
    opts: &BuildOptions,
    root: &Path,
    debs: &[crate::deb::DebFile],
    progress: &dyn Progress,
) -> Result<crate::layers::base::BaseRoot, BuildError> {
    let store = match &opts.layer_cache {
        None => Err("disabled".to_string()),
        Some(dir) => crate::layers::LayerStore::open(dir).map_err(|e| e.to_string()),
    };
    // Post-install commands may write any file in place: then nothing is shared.
    let mode = if opts.customization.post_install.is_empty() {
        crate::layers::CopyMode::Linked
    } else {
        crate::layers::CopyMode::Full
    };
    Ok(crate::layers::base::configured_root(
        plan,
        &builder_id(),
        store.as_ref().map_err(String::as_str),
        mode,
        root,
        debs,
        opts.data_limit,
        progress,
    )?)
}

/// The guest agent at its fixed path, where the initramfs hands over to it (built and
/// imported images alike).
pub(crate) fn install_agent(
    root: &Path,
    records: &mut crate::deb::Records,
    agent: Vec<u8>,
) -> Result<(), crate::customize::CustomizeError> {
    crate::customize::write_file(
        root,
        records,
        &crate::customize::FileEntry {
            path: AGENT_IN_IMAGE.into(),
            content: agent,
            mode: 0o755,
            uid: 0,
            gid: 0,
        },
    )?;
    records.insert(
        "/usr/lib/vse".into(),
        Meta {
            kind: Kind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
        },
    );
    Ok(())
}

/// Names a build's scratch directory, next to the image it becomes.
const SCRATCH: &str = ".vse-build-";

/// Removes the scratch directories of builds that died next to `parent`'s images (killed,
/// or their background removal cut short): each live build holds a lock on its own.
fn sweep_scratch(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let dead = e.file_name().to_string_lossy().starts_with(SCRATCH)
            && e.file_type().is_ok_and(|t| t.is_dir())
            && std::fs::File::open(e.path()).is_ok_and(|f| f.try_lock().is_ok());
        if dead {
            crate::layers::remove_in_background(e.path());
        }
    }
}

/// Removes a finished build's scratch directory (the unpacked root: tens of thousands of
/// files, often longer to delete than the rest of a rebuild takes) in the background, so the
/// image is ready without waiting for it. The image was already renamed into place; a removal
/// cut short leaves only a `.vse-build-*` directory, which is never an image.
fn discard(work: tempfile::TempDir) {
    crate::layers::remove_in_background(work.keep());
}

/// The optional parts: a qcow2 copy of the root disk, a rootfs tarball.
fn extras(
    root: &Path,
    records: &crate::deb::Records,
    raw: &Path,
    img: &Path,
    plan: &BuildPlan,
    opts: &BuildOptions,
    progress: &dyn Progress,
) -> Result<Vec<(&'static str, PathBuf)>, BuildError> {
    let mut files = Vec::new();
    if opts.qcow2 || opts.tar {
        progress.event(Event::Phase(Phase::Extras));
    }
    if opts.qcow2 {
        let q = img.join("root.qcow2");
        disk::to_qcow2(raw, &q)?;
        files.push(("qcow2", q));
    }
    if opts.tar {
        let t = img.join("rootfs.tar.gz");
        crate::tarball::write_tar_gz(root, records, &t, plan.epoch).map_err(io(&t))?;
        files.push(("tar", t));
    }
    Ok(files)
}

/// The manifest's parts: each file's name, size and SHA256.
fn parts(files: Vec<(&str, PathBuf)>) -> Result<BTreeMap<String, Part>, BuildError> {
    let mut parts = BTreeMap::new();
    for (key, path) in files {
        let (size, sha256) = hash_file(&path).map_err(io(&path))?;
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        parts.insert(key.to_string(), Part { file, size, sha256 });
    }
    Ok(parts)
}

/// Reads the agent and checks that it is a static ELF executable (no program interpreter):
/// a dynamic one would only run on a guest with the same libc.
pub(crate) fn check_agent(agent: &AgentBinary) -> Result<Vec<u8>, BuildError> {
    let err = |reason: String| BuildError::Agent {
        from: agent.describe(),
        reason,
    };
    let data = match agent {
        AgentBinary::File(path) => std::fs::read(path).map_err(|e| err(e.to_string()))?,
        AgentBinary::Embedded(data) => data.to_vec(),
    };
    if data.get(..5) != Some(b"\x7fELF\x02") {
        return Err(err("not a 64-bit ELF executable".into()));
    }
    let u = |off: usize, len: usize| -> u64 {
        let mut v = [0u8; 8];
        if let Some(b) = data.get(off..off + len) {
            v[..len].copy_from_slice(b);
        }
        u64::from_le_bytes(v)
    };
    let (phoff, phentsize, phnum) = (
        u(0x20, 8) as usize,
        u(0x36, 2) as usize,
        u(0x38, 2) as usize,
    );
    for i in 0..phnum {
        if u(phoff + i * phentsize, 4) == 3 {
            return Err(err(
                "dynamically linked (has PT_INTERP); it must be static".into()
            ));
        }
    }
    Ok(data)
}

/// The kernel version: the plan's kernel package, else the only kernel in the image.
pub(crate) fn find_kernel(root: &Path, plan: &BuildPlan) -> Result<String, BuildError> {
    let image = InRoot::open(root).map_err(io(root))?;
    let mut found: Vec<String> = image
        .read_dir("boot")
        .map(|entries| {
            entries
                .into_iter()
                .filter_map(|(name, _)| name.to_str()?.strip_prefix("vmlinuz-").map(str::to_string))
                .filter(|v| image.is_dir(&format!("usr/lib/modules/{v}")))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if let Some(k) = plan.packages.iter().find(|p| p.kernel)
        && let Some(v) = k.name.strip_prefix("linux-image-")
        && found.iter().any(|f| f == v)
    {
        return Ok(v.to_string());
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(BuildError::NoKernel(
            "no /boot/vmlinuz-* with modules".into(),
        )),
        _ => Err(BuildError::NoKernel(format!(
            "several kernels ({}) and none marked as the spec's kernel",
            found.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn scratch_of_a_dead_build_is_swept_and_a_live_one_kept() {
        let parent = tempfile::tempdir().unwrap();
        let (dead, live) = (
            parent.path().join(".vse-build-dead"),
            parent.path().join(".vse-build-live"),
        );
        for d in [&dead, &live] {
            std::fs::create_dir_all(d.join("rootfs/usr")).unwrap();
        }
        let other = parent.path().join("image");
        std::fs::create_dir(&other).unwrap();
        let held = std::fs::File::open(&live).unwrap();
        held.try_lock().unwrap();
        super::sweep_scratch(parent.path());
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while dead.exists() && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!dead.exists(), "the dead build's scratch stays");
        assert!(live.join("rootfs/usr").is_dir() && other.is_dir());
    }
}
