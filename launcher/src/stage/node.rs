//! The receiving side on a node: a listener that takes offers from whichever live ancestor is
//! sending (the parent, or a grand-parent after the parent died), writes chunks into the cache
//! under a temporary name, forwards them to its own children while still receiving, and reports
//! its subtree upwards.

use super::wire::{StageMsg, StageOutcome};
use super::{
    StageError, StageOptions,
    layout::{ChunkHash, Layout},
    send::{Report, SendCtx, send_children},
    store::{Store, Took},
};
use crate::sync::lock;
use agents::{
    proto::{self, LinkTx, NodeId},
    secret::{JobSecret, nonce},
    topo::Tree,
};
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch},
    task::{JoinHandle, JoinSet},
};

/// Progress a node reports to whoever runs it (a test, the agent's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageEvent {
    /// Chunks `0..next` of `count` are verified on this node.
    Progress { node: NodeId, next: u64, count: u64 },
    /// The cache already held the image.
    Cached { node: NodeId },
    /// A connection without valid credentials or with a bad offer was dropped.
    Rejected { node: NodeId, reason: String },
    /// A cache entry named after the offered digest whose content is not that image (planted
    /// or damaged) was removed; the image is staged again.
    Discarded { node: NodeId, dir: PathBuf },
    /// A partial image left by a dead owner (an agent killed mid-transfer) was removed.
    SweptPartial { node: NodeId, dir: PathBuf },
}

/// One image on this node: its store, its own outcome and its subtree's report.
struct Job {
    store: Arc<Store>,
    cached: bool,
    own_error: watch::Sender<Option<String>>,
    subtree: watch::Sender<Option<Report>>,
    _forward: Abort,
}

struct Abort(JoinHandle<()>);
impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Shared {
    me: NodeId,
    key: JobSecret,
    cache: PathBuf,
    opts: StageOptions,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    events: Option<mpsc::UnboundedSender<StageEvent>>,
}

impl Shared {
    fn emit(&self, e: StageEvent) {
        if let Some(ev) = &self.events {
            let _ = ev.send(e);
        }
    }
}

/// A node's staging listener. Dropping it (or [`StageServer::kill`]) stops everything it runs,
/// as a crash would: connections close, the partial image is removed.
pub struct StageServer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl StageServer {
    pub async fn start(
        bind: IpAddr,
        me: NodeId,
        key: JobSecret,
        cache: PathBuf,
        opts: StageOptions,
        events: Option<mpsc::UnboundedSender<StageEvent>>,
    ) -> Result<Self, StageError> {
        super::cache::prepare(&cache)?;
        let listener = TcpListener::bind((bind, 0))
            .await
            .map_err(|source| StageError::Listen { addr: bind, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| StageError::Listen { addr: bind, source })?;
        let shared = Arc::new(Shared {
            me,
            key,
            cache,
            opts,
            jobs: Mutex::new(HashMap::new()),
            events,
        });
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(Self { addr, task })
    }

    /// Starts a server from synchronous code running inside a Tokio runtime (an agent's event
    /// callback) and hands the result to `done`.
    pub fn start_in_background(
        bind: IpAddr,
        me: NodeId,
        key: JobSecret,
        cache: PathBuf,
        opts: StageOptions,
        done: impl FnOnce(Result<StageServer, StageError>) + Send + 'static,
    ) {
        tokio::spawn(async move { done(Self::start(bind, me, key, cache, opts, None).await) });
    }

    /// Stops the node abruptly (the in-process stand-in for SIGKILL).
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for StageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Owning the handlers here means aborting this task aborts them all.
    let mut handlers = JoinSet::new();
    let gate = agents::proto::Gate::default();
    loop {
        tokio::select! {
            (s, _, slot) = gate.accept(&listener) => {
                handlers.spawn(handle(s, slot, shared.clone()));
            }
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
        }
    }
}

async fn handle(stream: TcpStream, slot: tokio::sync::OwnedSemaphorePermit, sh: Arc<Shared>) {
    let o = sh.opts;
    let handshake = proto::accept(stream, &sh.key, o.handshake).await;
    // Authenticated (or refused): the connection no longer counts against the gate.
    drop(slot);
    let (mut tx, mut rx, first) = match handshake {
        Ok(x) => x,
        Err(e) => {
            return sh.emit(StageEvent::Rejected {
                node: sh.me,
                reason: e.to_string(),
            });
        }
    };
    // A cache hit reads the whole image to check it: off the async threads.
    let sh2 = sh.clone();
    let found = tokio::task::spawn_blocking(move || job_for(&sh2, first)).await;
    let found = found.unwrap_or_else(|e| {
        Err(StageError::Io(
            PathBuf::from("<staging worker>"),
            std::io::Error::other(e),
        ))
    });
    let job = match found {
        Ok(j) => j,
        Err(e) => {
            let reason = e.to_string();
            sh.emit(StageEvent::Rejected {
                node: sh.me,
                reason: reason.clone(),
            });
            let _ = tx.send(&failed(sh.me, reason)).await;
            return;
        }
    };
    let store = &job.store;
    let have = |s: &Store| StageMsg::Have {
        next: s.avail(),
        complete: s.is_complete(),
    };
    if tx.send(&have(store)).await.is_err() {
        return;
    }
    // Frames are read in their own task: a select must never cancel a half-read frame.
    let (in_tx, mut inbox) = mpsc::channel(4);
    let reader = Abort(tokio::spawn(async move {
        loop {
            let r = rx.recv().await;
            let stop = r.is_err();
            if in_tx.send(r).await.is_err() || stop {
                break;
            }
        }
    }));
    let mut tick = tokio::time::interval(o.heartbeat);
    let mut subtree = job.subtree.subscribe();
    let mut own_error = job.own_error.subscribe();
    let mut reported = false;
    loop {
        tokio::select! {
            m = inbox.recv() => match m {
                Some(Ok((StageMsg::Chunk { digest, index, encoding }, blob))) if digest == store.digest => {
                    // Decoding, hashing, writing and (after the last chunk) fsyncing a large
                    // image can take seconds on a busy disk: do it off the async threads and
                    // keep reporting meanwhile, so the sender does not take slow for dead.
                    // Forwarders get the chunk once it is verified, while it is written.
                    let st = store.clone();
                    let work = tokio::task::spawn_blocking(move || st.take(index, encoding, blob));
                    tokio::pin!(work);
                    let taken = loop {
                        tokio::select! {
                            r = &mut work => break r.unwrap_or_else(|e| {
                                Err(StageError::Io(PathBuf::from("<staging worker>"), std::io::Error::other(e)))
                            }),
                            _ = tick.tick() => {
                                // A lost sender shows up on the next send after the write.
                                let _ = tx.send(&have(store)).await;
                            }
                        }
                    };
                    match taken {
                        Ok(Took::Stored) => {
                            sh.emit(StageEvent::Progress {
                                node: sh.me,
                                next: store.avail(),
                                count: store.layout.count(),
                            });
                            if tx.send(&have(store)).await.is_err() {
                                break;
                            }
                        }
                        Ok(Took::Duplicate) => {}
                        Err(e) => {
                            let reason = e.to_string();
                            store.break_with(reason.clone());
                            job.own_error.send_replace(Some(reason.clone()));
                            let _ = tx.send(&failed(sh.me, reason)).await;
                            break;
                        }
                    }
                }
                Some(Ok((other, _))) => {
                    let reason = format!("unexpected staging message {other:?}");
                    let _ = tx.send(&failed(sh.me, reason)).await;
                    break;
                }
                // The sender left (died, or got our report): state stays for the next one.
                Some(Err(_)) | None => break,
            },
            _ = tick.tick() => {
                if tx.send(&have(store)).await.is_err() {
                    break;
                }
            }
            Ok(()) = own_error.changed(), if !reported => {
                let reason = own_error.borrow_and_update().clone();
                if let Some(reason) = reason {
                    let _ = tx.send(&failed(sh.me, reason)).await;
                    break;
                }
            }
            Ok(()) = subtree.changed(), if !reported => {
                let sub = subtree.borrow_and_update().clone();
                if let Some(sub) = sub {
                    reported = send_report(&mut tx, &sh, &job, sub).await;
                }
            }
        }
        if !reported && store.is_complete() {
            let sub = subtree.borrow().clone();
            if let Some(sub) = sub {
                reported = send_report(&mut tx, &sh, &job, sub).await;
            }
        }
    }
    drop(reader);
}

/// Sends own outcome + subtree once both are known; true when sent.
async fn send_report(tx: &mut LinkTx, sh: &Shared, job: &Job, sub: Report) -> bool {
    if !job.store.is_complete() {
        return false;
    }
    let own = if job.cached {
        StageOutcome::Cached
    } else {
        StageOutcome::Staged
    };
    let mut nodes = vec![(sh.me, own)];
    nodes.extend(sub);
    tx.send(&StageMsg::Report { nodes }).await.is_ok()
}

fn failed(me: NodeId, reason: String) -> StageMsg {
    StageMsg::Report {
        nodes: vec![(me, StageOutcome::Failed { reason })],
    }
}

/// The job for an offer: the running one, a cache hit, or a new partial image.
fn job_for(sh: &Arc<Shared>, first: StageMsg) -> Result<Arc<Job>, StageError> {
    let StageMsg::Offer {
        digest,
        files,
        chunk_size,
        table,
        k,
        nodes,
    } = first
    else {
        return Err(StageError::BadOffer(format!(
            "expected an offer first, got {first:?}"
        )));
    };
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(StageError::BadOffer(format!(
            "digest {digest:?}: expected 64 hex digits"
        )));
    }
    let digest = digest.to_ascii_lowercase();
    // The tree has one agent more than the largest id (the front-end is 0): an id of
    // u32::MAX leaves no count to make it.
    let size = nodes
        .iter()
        .map(|(n, _)| n.0)
        .max()
        .unwrap_or(0)
        .checked_add(1)
        .ok_or_else(|| StageError::BadOffer(format!("node id {} is out of range", u32::MAX)))?;
    let mut jobs = lock(&sh.jobs);
    if let Some(j) = jobs.get(&digest) {
        // Still receiving or forwarding: a re-parented sender resumes this run. Finished or
        // failed: this is a new run, which starts over (from the cache if it holds the image).
        let finished = j.store.is_complete() && j.subtree.borrow().is_some();
        if j.own_error.borrow().is_none() && !finished {
            return Ok(j.clone());
        }
    }
    let layout = Layout::new(files, chunk_size)?;
    let table = parse_table(&layout, &digest, table)?;
    let final_dir = sh.cache.join(&digest);
    // The entry's name is only a claim: its bytes must hash to the sender's digest.
    let cached = super::cache::holds(&layout, &final_dir, &digest);
    if !cached && final_dir.exists() {
        sh.emit(StageEvent::Discarded {
            node: sh.me,
            dir: final_dir.clone(),
        });
        super::cache::discard(&final_dir)?;
    }
    let store = if cached {
        sh.emit(StageEvent::Cached { node: sh.me });
        Store::complete(layout, digest.clone(), table, &final_dir, sh.opts.compress)?
    } else {
        // Partials left by an agent killed mid-transfer would otherwise pile up in the cache.
        for dir in super::store::sweep_stale_partials(&sh.cache) {
            sh.emit(StageEvent::SweptPartial { node: sh.me, dir });
        }
        let tag = nonce().map(hex::encode).unwrap_or_else(|_| "x".into());
        let partial = sh
            .cache
            .join(format!(".partial-{digest}-{}-{}", sh.me.0, &tag[..8]));
        Store::partial(
            layout,
            digest.clone(),
            table,
            partial,
            final_dir,
            sh.opts.compress,
        )?
    };
    let store = Arc::new(store);
    let ctx = Arc::new(SendCtx {
        key: sh.key.clone(),
        tree: Tree::new(size, k),
        nodes: nodes.into_iter().collect(),
        store: store.clone(),
        opts: sh.opts,
    });
    let subtree = watch::Sender::new(None);
    let report = subtree.clone();
    let kids = ctx.tree.children(sh.me);
    let forward = tokio::spawn(async move {
        let r = send_children(ctx, kids).await;
        report.send_replace(Some(r));
    });
    let job = Arc::new(Job {
        store,
        cached,
        own_error: watch::Sender::new(None),
        subtree,
        _forward: Abort(forward),
    });
    jobs.insert(digest, job.clone());
    Ok(job)
}

/// The offer's chunk table, checked against its digest before any entry is trusted.
fn parse_table(
    layout: &Layout,
    digest: &str,
    table: Vec<Option<String>>,
) -> Result<Vec<ChunkHash>, StageError> {
    if table.len() as u64 != layout.count() {
        return Err(StageError::BadOffer(format!(
            "chunk table has {} entries, expected {}",
            table.len(),
            layout.count()
        )));
    }
    let bad =
        |i: usize| StageError::BadOffer(format!("chunk table entry {i}: expected 64 hex digits"));
    let table = table
        .into_iter()
        .enumerate()
        .map(|(i, h)| match h {
            None => Ok(None),
            Some(h) => {
                let mut out = [0u8; 32];
                hex::decode_to_slice(&h, &mut out).map_err(|_| bad(i))?;
                Ok(Some(out))
            }
        })
        .collect::<Result<Vec<_>, StageError>>()?;
    if layout.digest(&table) != digest {
        return Err(StageError::BadOffer(format!(
            "chunk table does not hash to the offered digest {digest}"
        )));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzzing found it (fuzz/corpus/stage_receiver/regress-node-id-max): an offer naming node
    /// u32::MAX overflowed the tree size.
    #[test]
    fn an_offer_with_node_id_max_is_refused() {
        // Arrange
        let cache = tempfile::tempdir().unwrap();
        let sh = Arc::new(Shared {
            me: NodeId(1),
            key: JobSecret::from_hex(&"11".repeat(32)).unwrap(),
            cache: cache.path().to_path_buf(),
            opts: StageOptions::default(),
            jobs: Mutex::new(HashMap::new()),
            events: None,
        });
        let offer = StageMsg::Offer {
            digest: "0".repeat(64),
            files: vec![("a".into(), 1)],
            chunk_size: 1,
            table: vec![None],
            k: 2,
            nodes: vec![(NodeId(u32::MAX), "127.0.0.1:1".parse().unwrap())],
        };

        // Act
        let r = job_for(&sh, offer);

        // Assert
        assert!(matches!(r, Err(StageError::BadOffer(_))), "{:?}", r.err());
    }
}
