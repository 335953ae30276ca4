//! The staging receiver (`launcher::stage::StageServer`, what every node of a launch runs):
//! a real server on loopback, a peer that authenticates with the job key (a fuzzer cannot
//! forge it, and unauthenticated bytes are the agent_frame target's business) and then sends
//! the fuzzer's offer and chunks. The harness computes the chunk table and the image digest
//! from the fuzzer's files (so offers get past the digest check) unless the fuzzer overrides
//! them; chunk indices, encodings, corruptions, node ids, tree arity, chunk size and stray
//! messages are the fuzzer's. Errors are fine; panics, hangs and unbounded memory are not.
#![no_main]

use agents::proto::{self, NodeId};
use agents::secret::JobSecret;
use arbitrary::Arbitrary;
use launcher::stage::wire::StageMsg;
use launcher::stage::{Encoding, Layout, StageOptions, StageServer};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Arbitrary)]
struct Input {
    me: u32,
    files: Vec<(String, u16)>,
    chunk: u16,
    content: Vec<u8>,
    k: u32,
    nodes: Vec<u32>,
    /// Replaces the computed digest.
    digest: Option<String>,
    /// Replaces one table entry (index, new value) before the digest is computed.
    table_edit: Option<(u16, Option<String>)>,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// The next data chunk after the last one sent (what a sender does).
    Next {
        zstd: bool,
        corrupt: Option<(u16, u8)>,
    },
    /// Any index, with the data of that chunk when it exists.
    Index { index: u64, zstd: bool },
    /// The offer's own digest swapped for another.
    OtherDigest { index: u64 },
    /// A message that is not a chunk.
    Stray { have: bool },
}

const KEY_HEX: &str = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        vse_fuzz::ignore_sigpipe();
        // Few, short-lived blocking threads: the receiver writes every chunk on one, and with
        // tokio's defaults (512 threads kept 10 s) a run of fast executions piles up hundreds
        // of idle threads (and their sanitizer state) until the RSS limit trips.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(8)
            .thread_keep_alive(Duration::from_millis(200))
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// The image stream of the fuzzer's files: `content` repeated (zeros in it make holes).
fn stream(content: &[u8], total: usize) -> Vec<u8> {
    if content.is_empty() {
        return vec![0; total];
    }
    content.iter().copied().cycle().take(total).collect()
}

fn opts() -> StageOptions {
    StageOptions {
        chunk_size: 4096,
        window: 4,
        handshake: Duration::from_millis(500),
        heartbeat: Duration::from_secs(1),
        timeout: Duration::from_millis(300),
        rate: None,
        compress: None,
    }
}

fuzz_target!(|input: Input| {
    let key = JobSecret::from_hex(KEY_HEX).expect("key");
    let files: Vec<(String, u64)> = input
        .files
        .iter()
        .take(4)
        .map(|(n, s)| (n.clone(), u64::from(*s % 4097)))
        .collect();
    let chunk = if input.chunk == u16::MAX {
        u64::MAX
    } else {
        u64::from(input.chunk % 2049)
    };
    // The table and digest as an honest sender computes them (Layout sorts the files).
    let layout = Layout::new(files.clone(), chunk).ok();
    let total = layout.as_ref().map_or(0, |l| l.total() as usize);
    let data = stream(&input.content, total);
    let chunk_of = |i: u64| -> Option<Vec<u8>> {
        let l = layout.as_ref()?;
        if i >= l.count() {
            return None;
        }
        let start = (i * l.chunk_size()) as usize;
        let end = (start + l.chunk_size() as usize).min(total);
        Some(data[start..end].to_vec())
    };
    let mut table: Vec<Option<String>> = match &layout {
        Some(l) => (0..l.count())
            .map(|i| {
                let c = chunk_of(i).unwrap_or_default();
                (!c.iter().all(|&b| b == 0)).then(|| hex::encode(Sha256::digest(&c)))
            })
            .collect(),
        None => vec![],
    };
    if let Some((i, v)) = &input.table_edit
        && let Some(slot) = table.get_mut(usize::from(*i))
    {
        *slot = v.clone();
    }
    let digest = input.digest.clone().unwrap_or_else(|| match &layout {
        Some(l) => {
            let parsed: Vec<Option<[u8; 32]>> = table
                .iter()
                .map(|h| {
                    h.as_ref().map(|h| {
                        let mut o = [0u8; 32];
                        let _ = hex::decode_to_slice(h, &mut o);
                        o
                    })
                })
                .collect();
            l.digest(&parsed)
        }
        None => "0".repeat(64),
    });
    let dead: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
    let offer = StageMsg::Offer {
        digest: digest.clone(),
        files,
        chunk_size: chunk,
        table: table.clone(),
        k: input.k,
        nodes: input
            .nodes
            .iter()
            .take(8)
            .map(|n| (NodeId(*n), dead))
            .collect(),
    };
    let cache = tempfile::Builder::new()
        .prefix("vse-stage-")
        .tempdir()
        .expect("cache");
    rt().block_on(async {
        let server = StageServer::start(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            NodeId(input.me),
            key.clone(),
            cache.path().join("c"),
            opts(),
            None,
        )
        .await
        .expect("stage server");
        let Ok(stream) = tokio::net::TcpStream::connect(server.addr).await else {
            return;
        };
        let Ok((mut tx, mut rx, _answer)) =
            proto::connect::<StageMsg>(stream, &key, &offer, Duration::from_secs(2)).await
        else {
            return;
        };
        let mut next = 0u64;
        for op in input.ops.iter().take(16) {
            let (msg, blob) = match op {
                Op::Next { zstd, corrupt } => {
                    while next < table.len() as u64 && table[next as usize].is_none() {
                        next += 1;
                    }
                    let mut c = chunk_of(next).unwrap_or_else(|| input.content.clone());
                    if let Some((at, x)) = corrupt
                        && !c.is_empty()
                    {
                        let at = usize::from(*at) % c.len();
                        c[at] ^= x | 1;
                    }
                    let index = next;
                    next += 1;
                    encode(&digest, index, *zstd, c)
                }
                Op::Index { index, zstd } => {
                    let c = chunk_of(*index).unwrap_or_else(|| input.content.clone());
                    encode(&digest, *index, *zstd, c)
                }
                Op::OtherDigest { index } => (
                    StageMsg::Chunk {
                        digest: "f".repeat(64),
                        index: *index,
                        encoding: Encoding::Raw,
                    },
                    input.content.clone(),
                ),
                Op::Stray { have } => (
                    if *have {
                        StageMsg::Have {
                            next: 0,
                            complete: false,
                        }
                    } else {
                        offer.clone()
                    },
                    vec![],
                ),
            };
            if tx.send_blob(&msg, &blob).await.is_err() {
                break;
            }
        }
        // Answers until the receiver's report, its close, or a quiet spell (heartbeats are
        // rarer than the spell; small chunks are written in well under it).
        let end = tokio::time::Instant::now() + Duration::from_millis(500);
        while tokio::time::Instant::now() < end {
            match tokio::time::timeout(Duration::from_millis(30), rx.recv::<StageMsg>()).await {
                Ok(Ok((StageMsg::Report { .. }, _))) => break,
                Ok(Ok(_)) => {}
                _ => break,
            }
        }
        drop(server);
    });
});

fn encode(digest: &str, index: u64, zstd: bool, data: Vec<u8>) -> (StageMsg, Vec<u8>) {
    let (encoding, bytes) = if zstd {
        (
            Encoding::Zstd,
            zstd::bulk::compress(&data, 1).unwrap_or_default(),
        )
    } else {
        (Encoding::Raw, data)
    };
    (
        StageMsg::Chunk {
            digest: digest.to_string(),
            index,
            encoding,
        },
        bytes,
    )
}
