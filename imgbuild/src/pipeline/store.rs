//! The image store of `vse launch SPEC` and `srun --vse=SPEC`: `<root>/<key>/image`, where
//! the key is the lock's content (packages, repositories and the effective environment's
//! hash) without the spec's and policies' paths. An unchanged spec, policies and repositories
//! find the image built last time, wherever the spec now lives.

use super::{BuildRequest, LockRequest, PipelineError, Report, build_lock, relative_to, resolve};
use crate::build::{AgentBinary, BuildOutcome};
use crate::fetch::{DebCache, sha256_hex};
use std::path::{Path, PathBuf};
use vsec::env::EffectiveEnv;
use vsec::lock::SourceFiles;

#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

impl Default for ImageStore {
    /// `$VSE_CACHE/images`.
    fn default() -> Self {
        ImageStore::new(DebCache::default_root().join("images"))
    }
}

impl ImageStore {
    pub fn new(root: PathBuf) -> Self {
        ImageStore { root }
    }

    /// The image of `spec` under `policies` (`env`: their merge): resolved now, then found in
    /// (or built into) the store.
    pub fn image_for_spec(
        &self,
        spec: &Path,
        policies: &[PathBuf],
        env: &EffectiveEnv,
        agent: AgentBinary,
        report: &dyn Report,
    ) -> Result<BuildOutcome, PipelineError> {
        let req = LockRequest {
            spec,
            policies,
            lock_path: &self.root.join("vse.lock"),
            allow_expired: false,
        };
        let mut lock = resolve(env, &req, &[], report)?.lock;
        lock.source = SourceFiles::default();
        let key = sha256_hex(lock.to_toml().as_bytes());
        let dir = self.root.join(&key[..32]);
        lock.source = SourceFiles {
            spec: relative_to(spec, &dir),
            policies: policies.iter().map(|p| relative_to(p, &dir)).collect(),
        };
        let lock_path = dir.join("vse.lock");
        // Images here are booted as they are found: a store others may write is refused.
        vse_base::private_dir(&self.root, "image store (VSE_CACHE)")
            .map_err(|e| PipelineError::Cache(crate::fetch::FetchError::Unsafe(e)))?;
        std::fs::create_dir_all(&dir).map_err(|source| PipelineError::Store {
            dir: dir.clone(),
            source,
        })?;
        super::write_lock(&lock, &lock_path)?;
        let built = build_lock(
            &BuildRequest::new(lock_path, dir.join("image"), agent),
            report,
        )?;
        Ok(built.outcome)
    }
}
