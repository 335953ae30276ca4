//! The staging benchmark: the real staging code between in-process servers over loopback.

use crate::stage::{StageOptions, StageServer, stage_image};
use agents::{
    bench::{BenchError, runtime},
    proto::NodeId,
    secret::JobSecret,
};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct StagingFigures {
    pub nodes: u32,
    pub k: u32,
    pub bytes: u64,
    /// Pipelined tree staging (the launcher's way).
    pub tree_seconds: f64,
    /// The same image sent to one node after the other by the front-end.
    pub linear_seconds: f64,
    /// One node alone: size ÷ this is the per-link bandwidth the goal is measured against.
    pub single_seconds: f64,
    /// tree_seconds ÷ single_seconds (goal: flat in N and within 1.5).
    pub tree_vs_single: f64,
}

/// Stages an image of `bytes` random bytes (written under `work`) to `nodes` in-process staging
/// servers over loopback, each with its own cache under `work`: tree (fan-out `k`), linear,
/// and a single node for the bandwidth baseline. Caches are emptied between runs.
pub fn staging(
    nodes: u32,
    k: u32,
    bytes: u64,
    work: &std::path::Path,
) -> Result<StagingFigures, BenchError> {
    let io = |e: std::io::Error| BenchError::Run(format!("{}: {e}", work.display()));
    let img = work.join("image");
    std::fs::create_dir_all(&img).map_err(io)?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(img.join("root.ext4")).map_err(io)?;
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut buf = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            for b in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n]).map_err(io)?;
            left -= n as u64;
        }
        std::fs::write(img.join("manifest.json"), b"{}").map_err(io)?;
    }
    let key = JobSecret::generate()?;
    let opts = StageOptions::default();
    runtime()?.block_on(async {
        let mut servers = Vec::new();
        for i in 1..=nodes {
            let cache = work.join(format!("node{i}"));
            let s = StageServer::start(
                [127, 0, 0, 1].into(),
                NodeId(i),
                key.clone(),
                cache,
                opts,
                None,
            )
            .await
            .map_err(|e| BenchError::Run(e.to_string()))?;
            servers.push((NodeId(i), s.addr, s));
        }
        let plan: Vec<_> = servers.iter().map(|(i, a, _)| (*i, *a)).collect();
        let clear = || {
            for i in 1..=nodes {
                let _ = std::fs::remove_dir_all(work.join(format!("node{i}")));
                let _ = std::fs::create_dir_all(work.join(format!("node{i}")));
            }
        };
        let run = |plan: Vec<(NodeId, std::net::SocketAddr)>, k: u32| {
            let (img, key) = (img.clone(), key.clone());
            async move {
                let s = stage_image(&img, &plan, k, &key, opts)
                    .await
                    .map_err(|e| BenchError::Run(e.to_string()))?;
                if let Some((n, why)) = s.failed().first() {
                    return Err(BenchError::Run(format!("staging to {n} failed: {why}")));
                }
                Ok::<_, BenchError>((s.elapsed.as_secs_f64(), s.digest_seconds))
            }
        };
        clear();
        let single = run(plan[..1].to_vec(), k).await?.0;
        clear();
        let tree = run(plan.clone(), k).await?.0;
        clear();
        // A linear copy reads and hashes the image once, then sends it N times.
        let mut linear = 0.0;
        for (i, p) in plan.iter().enumerate() {
            let (all, digest) = run(vec![*p], k).await?;
            linear += if i == 0 { all } else { all - digest };
        }
        clear();
        Ok(StagingFigures {
            nodes,
            k,
            bytes,
            tree_seconds: tree,
            linear_seconds: linear,
            single_seconds: single,
            tree_vs_single: tree / single,
        })
    })
}
