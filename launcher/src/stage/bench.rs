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

/// Writes `bytes` of noise to `path`: no holes, no zeros, nothing zstd can shrink.
pub fn write_noise(path: &std::path::Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
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
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
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
    write_noise(&img.join("root.ext4"), bytes).map_err(io)?;
    std::fs::write(img.join("manifest.json"), b"{}").map_err(io)?;
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

/// One run of the real staging code on an existing image directory.
#[derive(Debug, Clone, Serialize)]
pub struct DirStaging {
    pub nodes: u32,
    pub k: u32,
    /// The image's size, holes included.
    pub bytes: u64,
    /// What was sent and written: the chunks that are not holes.
    pub data_bytes: u64,
    /// From the front-end's first read to every node's verified, fsynced, renamed copy.
    pub seconds: f64,
    /// The front-end's pass over the image (chunk hashes, holes) within `seconds`.
    pub digest_seconds: f64,
    /// Bytes allocated on disk for one node's copy (st_blocks).
    pub allocated_per_node: u64,
}

/// Stages the image in `image` to `nodes` in-process staging servers over loopback (fan-out
/// `k`), each with its own cache directory under `work`, removed afterwards.
pub fn stage_dir(
    image: &std::path::Path,
    nodes: u32,
    k: u32,
    work: &std::path::Path,
    opts: StageOptions,
) -> Result<DirStaging, BenchError> {
    let run_err = |e: &dyn std::fmt::Display| BenchError::Run(e.to_string());
    let key = JobSecret::generate()?;
    let caches: Vec<_> = (1..=nodes).map(|i| work.join(format!("node{i}"))).collect();
    let out = runtime()?.block_on(async {
        let mut servers = Vec::new();
        for (i, cache) in (1..=nodes).zip(&caches) {
            let s = StageServer::start(
                [127, 0, 0, 1].into(),
                NodeId(i),
                key.clone(),
                cache.clone(),
                opts,
                None,
            )
            .await
            .map_err(|e| run_err(&e))?;
            servers.push(s);
        }
        let plan: Vec<_> = (1..=nodes)
            .map(NodeId)
            .zip(servers.iter().map(|s| s.addr))
            .collect();
        stage_image(image, &plan, k, &key, opts)
            .await
            .map_err(|e| run_err(&e))
    });
    summarize(out?, &caches, k)
}

/// The figures of a finished staging; the nodes' caches are removed.
pub(super) fn summarize(
    s: crate::stage::StageSummary,
    caches: &[std::path::PathBuf],
    k: u32,
) -> Result<DirStaging, BenchError> {
    use std::os::unix::fs::MetadataExt;
    let run_err = |e: &dyn std::fmt::Display| BenchError::Run(e.to_string());
    if let Some((n, why)) = s.failed().first() {
        return Err(BenchError::Run(format!("staging to {n} failed: {why}")));
    }
    let mut allocated_per_node = 0;
    let copy = caches[0].join(&s.digest);
    for e in std::fs::read_dir(&copy).map_err(|e| run_err(&e))?.flatten() {
        allocated_per_node += e.metadata().map(|m| m.blocks() * 512).unwrap_or(0);
    }
    for c in caches {
        let _ = std::fs::remove_dir_all(c);
    }
    Ok(DirStaging {
        nodes: caches.len() as u32,
        k,
        bytes: s.bytes,
        data_bytes: s.data_bytes,
        seconds: s.elapsed.as_secs_f64(),
        digest_seconds: s.digest_seconds,
        allocated_per_node,
    })
}

/// One zstd level over an image's data chunks, on one core.
#[derive(Debug, Clone, Serialize)]
pub struct LevelFigures {
    /// zstd level (0: chunks sent raw).
    pub level: i32,
    pub data_bytes: u64,
    /// Bytes on the wire (compressed chunks, and raw ones where compression did not pay).
    pub wire_bytes: u64,
    /// Source side: encoding every data chunk.
    pub encode_mb_s: f64,
    /// Each receiver: decoding every data chunk and checking its SHA-256.
    pub decode_verify_mb_s: f64,
}

/// Encodes and decodes every data chunk of `image` at each of `levels`.
pub fn zstd_levels(
    image: &std::path::Path,
    chunk: u64,
    levels: &[i32],
) -> Result<Vec<LevelFigures>, BenchError> {
    use super::{chunk as enc, layout::Layout};
    use std::time::Instant;
    let run_err = |e: &dyn std::fmt::Display| BenchError::Run(e.to_string());
    let layout = Layout::from_dir(image, chunk).map_err(|e| run_err(&e))?;
    let files = layout.open_all(image, false).map_err(|e| run_err(&e))?;
    let mut chunks = Vec::new();
    for i in 0..layout.count() {
        if let Some(d) = layout
            .read_chunk(&files, i, image)
            .map_err(|e| run_err(&e))?
        {
            chunks.push((i, super::layout::sha256(&d), d));
        }
    }
    let data_bytes: u64 = chunks.iter().map(|c| c.2.len() as u64).sum();
    let mb = data_bytes as f64 / 1e6;
    let mut out = Vec::new();
    for &level in levels {
        let lv = (level > 0).then_some(level);
        let t = Instant::now();
        let encoded: Vec<_> = chunks
            .iter()
            .map(|c| enc::encode(c.2.clone(), lv))
            .collect();
        let compress = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for ((i, h, d), e) in chunks.iter().zip(&encoded) {
            enc::decode(*i, e.encoding, &e.bytes, d.len(), &Some(*h)).map_err(|e| run_err(&e))?;
        }
        let decompress = t.elapsed().as_secs_f64();
        out.push(LevelFigures {
            level,
            data_bytes,
            wire_bytes: encoded.iter().map(|e| e.bytes.len() as u64).sum(),
            encode_mb_s: mb / compress.max(1e-9),
            decode_verify_mb_s: mb / decompress.max(1e-9),
        });
    }
    Ok(out)
}
