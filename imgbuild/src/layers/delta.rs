//! From a layer to a slightly different package set without a clean build, only when the
//! result provably has a clean build's bytes.
//!
//! In a clean build every package is unpacked before any maintainer script runs, and then
//! dpkg configures them all: any script may look at any file, and scripts that allocate
//! (users, alternatives) see the others' results in dpkg's order. So a package is added or
//! removed on its own only when nothing can depend on when it came (it is *inert*):
//! - it has no maintainer scripts and declares no dpkg triggers;
//! - every file it ships lies where no other package's script or dpkg trigger reads it: the
//!   command directories, its own documentation and manual pages, `/usr/share/<pkg>`,
//!   `/usr/lib/<pkg>`, `/usr/libexec/<pkg>`, `/etc/<pkg>` — and none of these under a file
//!   trigger the image's own packages registered (`/var/lib/dpkg/triggers/File`);
//! - it overwrites no file that is already there, and shares no file with a package that
//!   stays; a new directory it makes lies in those places too.
//!
//! Then unpacking it last and letting dpkg configure it (nothing runs) writes exactly what a
//! clean build writes for it, and removing it takes exactly that away. Directory metadata
//! follows the clean build's rule (the last package in plan order that lists a directory
//! wins), recomputed from every package's own entries. Anything else falls back to a clean
//! build, and the reason is reported.

use super::{Layer, LayerPackage};
use crate::deb::{Kind, Meta, Records};
use crate::plan::BuildPlan;
use crate::progress::Progress;
use crate::rootfs::inroot::InRoot;
use crate::rootfs::{self, RootfsError, Unpacked, dpkgdb};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

/// More changed packages than this: build clean (each would be checked and unpacked alone).
const MAX_CHANGES: usize = 16;

/// Directories the builder itself makes before any package (`unpack_all`).
const BUILDER_DIRS: &[&str] = &["/", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64"];

const DEFAULT_DIR: Meta = Meta {
    kind: Kind::Dir,
    perm: 0o755,
    uid: 0,
    gid: 0,
};

/// A layer and what to change in it.
#[derive(Debug)]
pub struct Delta {
    pub base: Layer,
    /// Plan positions of packages the layer lacks.
    pub add: Vec<usize>,
    /// Layer packages the plan lacks.
    pub remove: Vec<LayerPackage>,
}

/// Why a delta was not possible or not proven.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// Not provably identical to a clean build: build clean (the reason is reported).
    #[error("{0}")]
    NotInert(String),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn same(p: &LayerPackage, q: &crate::plan::PlannedPackage) -> bool {
    p.name == q.name && p.version == q.version && p.sha256 == q.sha256
}

/// The closest layer the plan can be reached from, or why none can.
pub fn choose(layers: Vec<Layer>, plan: &BuildPlan) -> Result<Delta, String> {
    let mut best: Option<(usize, Result<Delta, String>)> = None;
    for base in layers {
        let add: Vec<usize> = (0..plan.packages.len())
            .filter(|&i| {
                !base
                    .meta
                    .packages
                    .iter()
                    .any(|p| same(p, &plan.packages[i]))
            })
            .collect();
        let remove: Vec<LayerPackage> = base
            .meta
            .packages
            .iter()
            .filter(|p| !plan.packages.iter().any(|q| same(p, q)))
            .cloned()
            .collect();
        let n = add.len() + remove.len();
        let candidate = if n > MAX_CHANGES {
            Err(format!(
                "{n} packages differ from the closest layer (at most {MAX_CHANGES} are changed in place)"
            ))
        } else if let Some(r) = remove.iter().find(|r| r.not_inert.is_some()) {
            Err(format!(
                "removing {}: {}",
                r.name,
                r.not_inert.as_deref().unwrap_or_default()
            ))
        } else {
            Ok(Delta { base, add, remove })
        };
        // Prefer a possible delta, then the smallest.
        let rank = n + if candidate.is_ok() { 0 } else { 1 << 20 };
        if best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, candidate));
        }
    }
    best.map_or_else(
        || Err("no layer of this builder and epoch yet".into()),
        |(_, c)| c,
    )
}

/// Where a file can be without any other package's script or trigger reading it.
fn inert_path(path: &str, pkg: &str) -> bool {
    let under = |d: &str| path == d || path.strip_prefix(d).is_some_and(|r| r.starts_with('/'));
    [
        "/usr/bin",
        "/usr/sbin",
        "/usr/games",
        "/usr/share/doc",
        "/usr/share/man",
        "/usr/share/lintian",
        "/usr/share/bug",
    ]
    .iter()
    .any(|d| under(d))
        || ["/usr/share", "/usr/lib", "/usr/libexec", "/etc"]
            .iter()
            .any(|d| under(&format!("{d}/{pkg}")))
}

/// Paths with a dpkg file trigger in the image: `(path, interested package)`.
pub fn trigger_interests(root: &Path) -> Vec<(String, String)> {
    InRoot::open(root)
        .and_then(|r| r.read_to_string("var/lib/dpkg/triggers/File"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (path, pkg) = l.split_once(' ')?;
            Some((
                path.trim_end_matches('/').to_string(),
                pkg.trim().to_string(),
            ))
        })
        .collect()
}

/// Why a package's own contents keep it from being added or removed alone, if they do.
pub fn judge(u: &Unpacked, own: &Records, interests: &[(String, String)]) -> Option<String> {
    let name = u.name();
    for f in ["preinst", "postinst", "prerm", "postrm", "config"] {
        if u.control.files.contains_key(f) {
            return Some(format!("{name} has a {f} maintainer script"));
        }
    }
    if u.control.files.contains_key("triggers") {
        return Some(format!("{name} declares dpkg triggers"));
    }
    for (path, meta) in own {
        if meta.kind != Kind::Dir && !inert_path(path, name) {
            return Some(format!(
                "{name} ships {path}, where other packages' scripts may read it"
            ));
        }
        if let Some((i, by)) = interests.iter().find(|(i, _)| {
            path == i
                || path
                    .strip_prefix(i.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        }) {
            return Some(format!(
                "{name} ships {path}, watched by {by}'s trigger on {i}"
            ));
        }
    }
    None
}

/// The layer-side description of a package unpacked from the plan.
pub fn layer_package(
    p: &crate::plan::PlannedPackage,
    u: &Unpacked,
    own: &Records,
    not_inert: Option<String>,
) -> LayerPackage {
    LayerPackage {
        name: p.name.clone(),
        version: p.version.clone(),
        sha256: p.sha256.clone(),
        stem: u.info_stem(),
        files: own
            .iter()
            .filter(|(_, m)| m.kind != Kind::Dir)
            .map(|(k, _)| k.clone())
            .collect(),
        dirs: own
            .iter()
            .filter(|(_, m)| m.kind == Kind::Dir)
            .map(|(k, m)| (k.clone(), *m))
            .collect(),
        not_inert,
    }
}

/// Every path of the tree at `root` (`/usr/bin/ls`), for the overwrite check.
fn tree_paths(root: &Path) -> Result<HashSet<String>, DeltaError> {
    let mut out = HashSet::from(["/".to_string()]);
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((host, rel)) = stack.pop() {
        let rd = std::fs::read_dir(&host).map_err(|source| DeltaError::Io {
            path: host.clone(),
            source,
        })?;
        for e in rd.flatten() {
            let p = format!("{rel}/{}", e.file_name().to_string_lossy());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), p.clone()));
            }
            out.insert(p);
        }
    }
    Ok(out)
}

/// Applies `delta` to `root`, a copy of `delta.base`'s tree: removes and adds packages and
/// lets the image's dpkg configure what was added. Returns the records and the packages of
/// the result, in plan order. [`DeltaError::NotInert`] means: build clean instead.
pub fn apply(
    delta: &Delta,
    plan: &BuildPlan,
    debs: &[crate::deb::DebFile],
    root: &Path,
    limit: u64,
    progress: &dyn Progress,
) -> Result<(Records, Vec<LayerPackage>), DeltaError> {
    let no = |s: String| Err(DeltaError::NotInert(s));
    let ioe = |path: PathBuf| move |source| DeltaError::Io { path, source };
    let mut records = delta.base.meta.records.clone();
    let kept: Vec<&LayerPackage> = delta
        .base
        .meta
        .packages
        .iter()
        .filter(|p| {
            !delta
                .remove
                .iter()
                .any(|r| r.name == p.name && r.sha256 == p.sha256)
        })
        .collect();
    let image = InRoot::open(root).map_err(ioe(root.to_path_buf()))?;
    let mut touched_dirs: BTreeSet<String> = BTreeSet::new();
    for r in &delta.remove {
        for d in r.dirs.keys() {
            let others = kept.iter().any(|k| k.dirs.contains_key(d));
            if !others && !BUILDER_DIRS.contains(&d.as_str()) && !inert_path(d, &r.name) {
                return no(format!(
                    "removing {}: it alone made the directory {d}",
                    r.name
                ));
            }
        }
        for f in &r.files {
            if let Some(o) = kept.iter().find(|k| k.files.contains(f)) {
                return no(format!(
                    "removing {}: {f} is shared with {}",
                    r.name, o.name
                ));
            }
            // Scripts ran in this tree: a planted link on the way must not lead out of it.
            image.remove_file(f).map_err(ioe(image.display(f)))?;
            records.remove(f);
        }
        dpkgdb::remove_one(&image, &r.stem).map_err(ioe(root.join("var/lib/dpkg")))?;
        touched_dirs.extend(r.dirs.keys().cloned());
    }
    let before = tree_paths(root)?;
    let interests = trigger_interests(root);
    let mut added = Vec::new();
    for &i in &delta.add {
        let p = &plan.packages[i];
        let (u, own) = rootfs::unpack_one(root, &p.name, &debs[i], limit)?;
        if let Some(why) = judge(&u, &own, &interests) {
            return no(format!("adding {why}"));
        }
        for (path, meta) in &own {
            let existed = before.contains(path);
            if meta.kind != Kind::Dir && existed {
                return no(format!("adding {}: it overwrites {path}", p.name));
            }
            if meta.kind == Kind::Dir && !existed && !inert_path(path, &p.name) {
                return no(format!(
                    "adding {}: it creates the directory {path}",
                    p.name
                ));
            }
            if meta.kind != Kind::Dir {
                records.insert(path.clone(), *meta);
            }
        }
        dpkgdb::add_one(&image, &u).map_err(ioe(root.join("var/lib/dpkg")))?;
        touched_dirs.extend(own.keys().filter(|k| own[*k].kind == Kind::Dir).cloned());
        added.push((i, layer_package(p, &u, &own, None)));
    }
    // The result's packages in plan order.
    let mut packages: Vec<LayerPackage> = Vec::with_capacity(plan.packages.len());
    for (i, q) in plan.packages.iter().enumerate() {
        match added.iter().find(|(j, _)| *j == i) {
            Some((_, lp)) => packages.push(lp.clone()),
            None => match kept.iter().find(|k| same(k, q)) {
                Some(k) => packages.push((*k).clone()),
                None => return no(format!("{} is in neither the layer nor the delta", q.name)),
            },
        }
    }
    settle_dirs(root, &touched_dirs, &packages, &mut records)?;
    if !added.is_empty() {
        rootfs::configure_added(root, plan.epoch, progress)?;
    }
    Ok((records, packages))
}

/// Gives every directory a change touched the metadata a clean build gives it (the last
/// package in plan order listing it), and removes those no package lists any more.
fn settle_dirs(
    root: &Path,
    dirs: &BTreeSet<String>,
    packages: &[LayerPackage],
    records: &mut Records,
) -> Result<(), DeltaError> {
    let listed: BTreeMap<&str, Meta> = packages
        .iter()
        .flat_map(|p| p.dirs.iter().map(|(d, m)| (d.as_str(), *m)))
        .collect();
    // Deepest first, so that emptied parents can go too.
    for d in dirs.iter().rev() {
        if let Some(m) = listed.get(d.as_str()) {
            records.insert(d.clone(), *m);
        } else if BUILDER_DIRS.contains(&d.as_str()) {
            records.insert(d.clone(), DEFAULT_DIR);
        } else {
            let host = root.join(d.trim_start_matches('/'));
            if std::fs::remove_dir(&host).is_err() {
                return Err(DeltaError::NotInert(format!(
                    "{d} is left non-empty by a removed package"
                )));
            }
            records.remove(d);
        }
    }
    Ok(())
}
