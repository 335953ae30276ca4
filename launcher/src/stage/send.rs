//! The sending side, run by the front-end for its children and by every node for its own: offer,
//! resume from what the child has, stream chunks as they become available, collect the child's
//! subtree report. A child that fails is reported and its children are adopted (sent to
//! directly), recursively, so one dead node costs its subtree nothing but a resend.

use super::wire::{StageMsg, StageOutcome};
use super::{StageError, StageOptions, layout::Layout, store::Store};
use agents::{
    proto::{self, LinkRx, NodeId, ProtoError},
    secret::JobSecret,
    topo::Tree,
};
use std::{
    collections::HashMap, future::Future, net::SocketAddr, path::Path, pin::Pin, sync::Arc,
    time::Duration,
};
use tokio::{
    net::TcpStream,
    sync::mpsc,
    task::JoinSet,
    time::{Instant, sleep_until, timeout},
};

/// Everything a sender needs, shared by all the sending tasks of one node.
pub(crate) struct SendCtx {
    pub key: JobSecret,
    pub tree: Tree,
    pub nodes: HashMap<NodeId, SocketAddr>,
    pub store: Arc<Store>,
    pub opts: StageOptions,
}

impl SendCtx {
    pub fn offer(&self) -> StageMsg {
        let mut nodes: Vec<_> = self.nodes.iter().map(|(a, b)| (*a, *b)).collect();
        nodes.sort();
        StageMsg::Offer {
            digest: self.store.digest.clone(),
            files: self.store.layout.files(),
            chunk_size: self.store.layout.chunk_size(),
            table: self
                .store
                .table
                .iter()
                .map(|c| c.map(hex::encode))
                .collect(),
            k: self.tree.k(),
            nodes,
        }
    }
}

pub(crate) type Report = Vec<(NodeId, StageOutcome)>;

/// Why staging to one child failed; its text is the child's `StageOutcome::Failed` reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChildError {
    #[error("no connection to {addr} within {after:?}")]
    ConnectTimeout { addr: SocketAddr, after: Duration },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("staging handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        source: ProtoError,
    },
    #[error("unexpected answer to the offer: {0}")]
    UnexpectedAnswer(String),
    #[error("unexpected message {0}")]
    Unexpected(String),
    #[error("lost during staging: {0}")]
    Lost(#[source] ProtoError),
    #[error("lost during staging")]
    Gone,
    #[error("sender's image store closed")]
    StoreClosed,
    #[error("reading chunk {index}: {source}")]
    Read { index: u64, source: StageError },
    #[error("chunk {index} not accepted within {after:?}")]
    SendTimeout { index: u64, after: Duration },
    #[error("sending chunk {index}: {source}")]
    Send { index: u64, source: ProtoError },
    #[error("its sender's copy of the image is unusable")]
    SenderBroken,
    #[error("silent for {0} ms during staging")]
    Silent(u128),
    /// The child's own report of its failure.
    #[error("{0}")]
    Reported(String),
    #[error("its report does not mention it")]
    NotInReport,
}

/// How often a broken connection to a live child is dialled again, and after how long.
const RECONNECTS: u32 = 2;
const RECONNECT_AFTER: Duration = Duration::from_millis(100);

impl ChildError {
    /// The connection broke while the child may well be alive.
    fn broken_link(&self) -> bool {
        matches!(
            self,
            ChildError::Lost(_) | ChildError::Gone | ChildError::Send { .. }
        )
    }
}

/// Stages `child`'s whole subtree; never fails, failures are in the report.
pub(crate) fn send_subtree(
    ctx: Arc<SendCtx>,
    child: NodeId,
) -> Pin<Box<dyn Future<Output = Report> + Send>> {
    Box::pin(async move {
        if !ctx.nodes.contains_key(&child) {
            return send_children(ctx.clone(), ctx.tree.children(child)).await;
        }
        let mut tries = 0;
        let sent = loop {
            match send_one(&ctx, child).await {
                // A connection broken mid-image (a frame that failed authentication, a reset)
                // is dialled again: the child resumes from the chunks it verified, so what was
                // damaged on the way is fetched again. A child that is gone refuses the dial.
                Err(e) if e.broken_link() && tries < RECONNECTS => {
                    tries += 1;
                    tokio::time::sleep(RECONNECT_AFTER).await;
                }
                r => break r,
            }
        };
        match sent {
            Ok(report) => report,
            Err(e) => {
                // Re-parent: this node takes over the dead child's children.
                let reason = e.to_string();
                let mut out = vec![(child, StageOutcome::Failed { reason })];
                out.extend(send_children(ctx.clone(), ctx.tree.children(child)).await);
                out
            }
        }
    })
}

pub(crate) async fn send_children(ctx: Arc<SendCtx>, children: Vec<NodeId>) -> Report {
    let mut set = JoinSet::new();
    for c in children {
        set.spawn(send_subtree(ctx.clone(), c));
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.extend(r.unwrap_or_default());
    }
    out
}

/// Reads the child's frames in their own task: `LinkRx::recv` must not be cancelled mid-frame.
fn reader(mut rx: LinkRx) -> mpsc::Receiver<Result<StageMsg, ProtoError>> {
    let (tx, out) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let m = rx.recv().await.map(|(m, _)| m);
            let stop = m.is_err();
            if tx.send(m).await.is_err() || stop {
                break;
            }
        }
    });
    out
}

async fn send_one(ctx: &SendCtx, child: NodeId) -> Result<Report, ChildError> {
    let addr = ctx.nodes[&child];
    let o = &ctx.opts;
    let stream = timeout(o.handshake, TcpStream::connect(addr))
        .await
        .map_err(|_| ChildError::ConnectTimeout {
            addr,
            after: o.handshake,
        })?
        .map_err(|source| ChildError::Connect { addr, source })?;
    let (mut tx, rx, answer) = proto::connect(stream, &ctx.key, &ctx.offer(), o.handshake)
        .await
        .map_err(|source| ChildError::Handshake { addr, source })?;
    let mut rx = reader(rx);
    let (mut acked, complete) = match answer {
        StageMsg::Have { next, complete } => (next, complete),
        StageMsg::Report { nodes } => return check_report(child, nodes),
        other => return Err(ChildError::UnexpectedAnswer(format!("{other:?}"))),
    };
    let store = &ctx.store;
    let count = store.layout.count();
    let mut sent = store.next_data(if complete { count } else { acked.min(count) });
    let mut verified = store.watch_verified();
    let mut broken = store.watch_broken();
    let mut silent_until = Instant::now() + o.timeout;
    let mut next_send = Instant::now();
    loop {
        let can_send = sent < count && sent < acked + o.window;
        tokio::select! {
            m = rx.recv() => {
                silent_until = Instant::now() + o.timeout;
                match m {
                    Some(Ok(StageMsg::Have { next, .. })) => acked = acked.max(next),
                    Some(Ok(StageMsg::Report { nodes })) => return check_report(child, nodes),
                    Some(Ok(other)) => return Err(ChildError::Unexpected(format!("{other:?}"))),
                    Some(Err(e)) => return Err(ChildError::Lost(e)),
                    None => return Err(ChildError::Gone),
                }
            }
            ok = async { verified.wait_for(|v| *v > sent).await.is_ok() }, if can_send => {
                if !ok {
                    return Err(ChildError::StoreClosed);
                }
                sleep_until(next_send).await;
                // Received chunks are forwarded as they came; a source or cache hit reads and
                // encodes each chunk once for all its children.
                let st = store.clone();
                let index = sent;
                let enc = tokio::task::spawn_blocking(move || st.wire(index))
                    .await
                    .map_err(|e| ChildError::Read {
                        index,
                        source: StageError::Io("<staging worker>".into(), std::io::Error::other(e)),
                    })?
                    .map_err(|source| ChildError::Read { index, source })?;
                // Encode the next chunk while this one is on its way (a source or cache hit
                // reads and compresses; received chunks are ready). Only verified chunks: a
                // partial store's later chunks are not on disk yet.
                let ahead = store.next_data(index + 1);
                if ahead < *verified.borrow() {
                    let st = store.clone();
                    tokio::task::spawn_blocking(move || st.wire(ahead));
                }
                let msg = StageMsg::Chunk {
                    digest: store.digest.clone(),
                    index,
                    encoding: enc.encoding,
                };
                timeout(o.timeout, tx.send_blob(&msg, &enc.bytes))
                    .await
                    .map_err(|_| ChildError::SendTimeout {
                        index,
                        after: o.timeout,
                    })?
                    .map_err(|source| ChildError::Send { index, source })?;
                if let Some(rate) = o.rate.filter(|r| *r > 0) {
                    next_send = Instant::now()
                        + Duration::from_secs_f64(enc.bytes.len() as f64 / rate as f64);
                }
                sent = store.next_data(index + 1);
            }
            true = async { broken.wait_for(|b| b.is_some()).await.is_ok() } => {
                // Our own copy went bad: whoever sends to us will re-parent this child.
                return Err(ChildError::SenderBroken);
            }
            _ = sleep_until(silent_until) => {
                return Err(ChildError::Silent(o.timeout.as_millis()));
            }
        }
    }
}

fn check_report(child: NodeId, nodes: Report) -> Result<Report, ChildError> {
    match nodes.iter().find(|(n, _)| *n == child) {
        Some((_, StageOutcome::Failed { reason })) => Err(ChildError::Reported(reason.clone())),
        Some(_) => Ok(nodes),
        None => Err(ChildError::NotInReport),
    }
}

/// What the front-end learns from staging one image.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageSummary {
    pub digest: String,
    /// The image's size (holes included).
    pub bytes: u64,
    /// What was sent: the chunks that are not holes.
    pub data_bytes: u64,
    pub chunks: u64,
    /// Every node of the plan, in id order.
    pub nodes: Vec<(NodeId, StageOutcome)>,
    /// Whole run, the front-end's digest pass over the image included.
    pub elapsed: Duration,
    /// The front-end's pass over the image (chunk hashes, holes, digest) alone.
    pub digest_seconds: f64,
}

impl StageSummary {
    pub fn failed(&self) -> Vec<(NodeId, String)> {
        self.nodes
            .iter()
            .filter_map(|(n, o)| match o {
                StageOutcome::Failed { reason } => Some((*n, reason.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Front-end: stages the image in `dir` to every node of `nodes` (ids 1..=N of a k-ary tree
/// rooted at the front-end, agent 0) through their [`super::StageServer`]s.
pub async fn stage_image(
    dir: &Path,
    nodes: &[(NodeId, SocketAddr)],
    k: u32,
    key: &JobSecret,
    opts: StageOptions,
) -> Result<StageSummary, StageError> {
    let start = std::time::Instant::now();
    let layout = Layout::from_dir(dir, opts.chunk_size)?;
    let digest_start = std::time::Instant::now();
    let table = {
        let (l, d) = (layout.clone(), dir.to_path_buf());
        tokio::task::spawn_blocking(move || super::stamp::table(&l, &d))
            .await
            .map_err(|e| StageError::BadImage(format!("digest task: {e}")))??
    };
    let digest = layout.digest(&table);
    let digest_seconds = digest_start.elapsed().as_secs_f64();
    let size = nodes.iter().map(|(n, _)| n.0).max().unwrap_or(0) + 1;
    let (bytes, chunks) = (layout.total(), layout.count());
    let ctx = Arc::new(SendCtx {
        key: key.clone(),
        tree: Tree::new(size, k),
        nodes: nodes.iter().copied().collect(),
        store: Arc::new(Store::complete(
            layout,
            digest.clone(),
            table,
            dir,
            opts.compress,
        )?),
        opts,
    });
    let data_bytes = ctx.store.data_bytes();
    let mut report = send_children(ctx.clone(), ctx.tree.children(NodeId(0))).await;
    // A node the tree cannot reach (its ancestors are not in the plan) is a failure too.
    for (n, _) in nodes {
        if !report.iter().any(|(r, _)| r == n) {
            report.push((
                *n,
                StageOutcome::Failed {
                    reason: "unreachable in the staging tree".into(),
                },
            ));
        }
    }
    report.sort_by_key(|(n, _)| *n);
    report.dedup_by_key(|(n, _)| *n);
    Ok(StageSummary {
        digest,
        bytes,
        data_bytes,
        chunks,
        nodes: report,
        elapsed: start.elapsed(),
        digest_seconds,
    })
}
