//! The configured root of a build: from the layer of its package set, from a close layer
//! and a provable delta, or unpacked and configured clean (then saved as a layer).

use super::delta::{self, DeltaError};
use super::{CopyMode, LayerError, LayerMeta, LayerStore, copy_tree, layer_key};
use crate::deb::{DebFile, Records};
use crate::plan::BuildPlan;
use crate::progress::{Event, Phase, Progress};
use crate::rootfs::{self, RootfsError};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How a build's configured root was obtained. Told in the build's report (`vse build
/// --json`), never in the image: two builds of one lock are the same bytes whichever way
/// they went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RootSource {
    /// Unpacked and configured here; `why` says why no layer could be used.
    Clean { why: String },
    /// The layer of this exact package set.
    Layer { layer: String },
    /// Another layer with packages added and removed (each provably inert).
    Delta {
        from_layer: String,
        added: Vec<String>,
        removed: Vec<String>,
    },
}

/// What [`configured_root`] made.
#[derive(Debug)]
pub struct BaseRoot {
    pub records: Records,
    pub source: RootSource,
    /// The layer key of the plan (saved unless `note` says why not).
    pub layer: String,
    /// A layer store that could not be used or written (the build goes on without it).
    pub note: Option<String>,
}

/// Makes the configured root of `plan` in the empty directory `root`. `debs[i]` is the
/// `.deb` of `plan.packages[i]`. `mode` says how `root` may share files with the store (what
/// the caller does with `root` afterwards must stay within it).
#[allow(clippy::too_many_arguments)]
pub fn configured_root(
    plan: &BuildPlan,
    builder: &str,
    store: Result<&LayerStore, &str>,
    mode: CopyMode,
    root: &Path,
    debs: &[DebFile],
    limit: u64,
    progress: &dyn Progress,
) -> Result<BaseRoot, BaseError> {
    let key = layer_key(plan, builder);
    let why_clean = match store {
        Err(why) => format!("no layer store ({why})"),
        Ok(st) => {
            if let Some(layer) = st.get(&key) {
                progress.event(Event::Phase(Phase::Unpack));
                copy_tree(&layer.tree, root, mode)?;
                return Ok(BaseRoot {
                    records: layer.meta.records,
                    source: RootSource::Layer { layer: key.clone() },
                    layer: key,
                    note: None,
                });
            }
            match delta::choose(st.all(builder, plan.epoch), plan) {
                Err(why) => why,
                Ok(d) => {
                    progress.event(Event::Phase(Phase::Unpack));
                    copy_tree(&d.base.tree, root, mode)?;
                    match delta::apply(&d, plan, debs, root, limit, progress) {
                        Ok((records, packages)) => {
                            let meta = LayerMeta {
                                format: super::FORMAT,
                                builder: builder.to_string(),
                                epoch: plan.epoch,
                                packages,
                                records,
                            };
                            progress.event(Event::Phase(Phase::SaveLayer));
                            let note = st
                                .save(&key, root, &meta, mode)
                                .err()
                                .map(|e| e.to_string());
                            let name = |i: &usize| plan.packages[*i].name.clone();
                            return Ok(BaseRoot {
                                records: meta.records,
                                source: RootSource::Delta {
                                    from_layer: d.base.key.clone(),
                                    added: d.add.iter().map(name).collect(),
                                    removed: d.remove.iter().map(|r| r.name.clone()).collect(),
                                },
                                layer: key,
                                note,
                            });
                        }
                        Err(DeltaError::NotInert(why)) => {
                            empty_dir(root)?;
                            why
                        }
                        Err(DeltaError::Rootfs(e)) => return Err(e.into()),
                        Err(DeltaError::Io { path, source }) => {
                            return Err(BaseError::Io { path, source });
                        }
                    }
                }
            }
        }
    };
    let ctx = Clean {
        store: store.ok(),
        mode,
        key,
        why: why_clean,
    };
    clean(plan, builder, ctx, root, debs, limit, progress)
}

fn empty_dir(root: &Path) -> Result<(), BaseError> {
    let io = |source| BaseError::Io {
        path: root.to_path_buf(),
        source,
    };
    std::fs::remove_dir_all(root).map_err(io)?;
    std::fs::create_dir_all(root).map_err(io)
}

/// Where a clean root is saved, and why it is clean.
struct Clean<'a> {
    store: Option<&'a LayerStore>,
    mode: CopyMode,
    key: String,
    why: String,
}

fn clean(
    plan: &BuildPlan,
    builder: &str,
    ctx: Clean<'_>,
    root: &Path,
    debs: &[DebFile],
    limit: u64,
    progress: &dyn Progress,
) -> Result<BaseRoot, BaseError> {
    let Clean {
        store,
        mode,
        key,
        why,
    } = ctx;
    progress.event(Event::Phase(Phase::Unpack));
    let named: Vec<(String, DebFile)> = plan
        .packages
        .iter()
        .zip(debs)
        .map(|(p, d)| (p.name.clone(), d.clone()))
        .collect();
    let (records, pkgs) = rootfs::unpack_all_with_own(root, &named, limit, progress)?;
    progress.event(Event::Phase(Phase::Configure));
    let unpacked: Vec<rootfs::Unpacked> = pkgs.iter().map(|(u, _)| u.clone()).collect();
    rootfs::configure(root, &unpacked, plan.epoch, progress)?;
    let mut note = None;
    if let Some(st) = store {
        progress.event(Event::Phase(Phase::SaveLayer));
        let interests = delta::trigger_interests(root);
        let packages = plan
            .packages
            .iter()
            .zip(&pkgs)
            .map(|(p, (u, own))| delta::layer_package(p, u, own, delta::judge(u, own, &interests)))
            .collect();
        let meta = LayerMeta {
            format: super::FORMAT,
            builder: builder.to_string(),
            epoch: plan.epoch,
            packages,
            records,
        };
        note = st
            .save(&key, root, &meta, mode)
            .err()
            .map(|e| e.to_string());
        return Ok(BaseRoot {
            records: meta.records,
            source: RootSource::Clean { why },
            layer: key,
            note,
        });
    }
    note.get_or_insert_with(|| "no layer store".to_string());
    Ok(BaseRoot {
        records,
        source: RootSource::Clean { why },
        layer: key,
        note,
    })
}
