//! Image staging with every node a staging server of this process (real sockets, real
//! protocol, real files): pipelining down the tree, per-node caches, skipping cached nodes,
//! a killed interior node whose subtree is re-parented, and foreign credentials.

use agents::{proto::NodeId, secret::JobSecret};
use launcher::stage::{StageEvent, StageOptions, StageOutcome, StageServer, stage_image};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};
use tokio::sync::mpsc;

struct Cluster {
    servers: Vec<(NodeId, StageServer)>,
    caches: Vec<PathBuf>,
    events: mpsc::UnboundedReceiver<StageEvent>,
    _root: tempfile::TempDir,
}

impl Cluster {
    async fn start(n: u32, key: &JobSecret, opts: StageOptions) -> Self {
        let root = tempfile::tempdir().unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let mut servers = Vec::new();
        let mut caches = Vec::new();
        for i in 1..=n {
            let cache = root.path().join(format!("node{i}"));
            let s = StageServer::start(
                "127.0.0.1".parse().unwrap(),
                NodeId(i),
                key.clone(),
                cache.clone(),
                opts,
                Some(tx.clone()),
            )
            .await
            .unwrap();
            servers.push((NodeId(i), s));
            caches.push(cache);
        }
        Self {
            servers,
            caches,
            events,
            _root: root,
        }
    }

    fn plan(&self) -> Vec<(NodeId, SocketAddr)> {
        self.servers.iter().map(|(i, s)| (*i, s.addr)).collect()
    }

    fn cache(&self, n: u32) -> &Path {
        &self.caches[n as usize - 1]
    }
}

/// An image directory shaped like `vse build`'s, with incompressible content.
fn image(dir: &Path, mib: usize) -> Vec<(String, Vec<u8>)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = |n: usize| {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    let files = vec![
        ("manifest.json".to_string(), b"{\"name\":\"test\"}".to_vec()),
        ("vmlinuz".to_string(), bytes(300_001)),
        ("initrd".to_string(), bytes(123_457)),
        ("root.ext4".to_string(), bytes(mib << 20)),
    ];
    for (n, d) in &files {
        std::fs::write(dir.join(n), d).unwrap();
    }
    files
}

/// Like [`image`], but the root file system is what images are made of: compressible blocks,
/// zero chunks and noise, so chunks travel compressed, raw and not at all.
fn mixed_image(dir: &Path, mib: usize) -> Vec<(String, Vec<u8>)> {
    let mut files = image(dir, mib);
    let root = &mut files[3].1;
    for (i, block) in root.chunks_mut(64 << 10).enumerate() {
        match i % 4 {
            0 => block.fill(0),
            1 => {
                let text = b"inode table, directory entries, /usr/lib/x86_64-linux-gnu ";
                for (j, b) in block.iter_mut().enumerate() {
                    *b = text[j % text.len()];
                }
            }
            _ => {}
        }
    }
    // Whole chunks of zeros too (the tests' chunks are 256 KiB).
    root[1 << 20..2 << 20].fill(0);
    std::fs::write(dir.join("root.ext4"), &*root).unwrap();
    files
}

fn assert_image_at(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (n, d) in files {
        let got = std::fs::read(dir.join(n)).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert!(
            got == *d,
            "{} differs from the source",
            dir.join(n).display()
        );
    }
}

fn no_partials(cache: &Path) {
    if let Ok(rd) = std::fs::read_dir(cache) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with(".partial"), "partial left: {name}");
        }
    }
}

fn opts(rate: Option<u64>) -> StageOptions {
    StageOptions {
        chunk_size: 256 << 10,
        heartbeat: Duration::from_millis(100),
        timeout: Duration::from_secs(2),
        rate,
        ..StageOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_down_the_tree_then_cached_on_rerun() {
    let key = JobSecret::generate().unwrap();
    // 7 nodes, k = 2: levels 1 (1,2), 2 (3..6), 3 (7)
    let mut c = Cluster::start(7, &key, opts(Some(16 << 20))).await;
    let src = tempfile::tempdir().unwrap();
    let files = mixed_image(src.path(), 4);
    let s = stage_image(src.path(), &c.plan(), 2, &key, opts(Some(16 << 20)))
        .await
        .unwrap();
    eprintln!(
        "staged {} bytes ({} of data) in {} chunks in {:?}",
        s.bytes, s.data_bytes, s.chunks, s.elapsed
    );
    // The zero MiB of the root file system covers at least 3 whole 256 KiB chunks.
    assert!(
        s.data_bytes <= s.bytes - (768 << 10),
        "zero chunks were sent"
    );
    assert_eq!(s.nodes.len(), 7);
    for (n, o) in &s.nodes {
        assert_eq!(*o, StageOutcome::Staged, "{n}");
        let dir = c.cache(n.0).join(&s.digest);
        assert_image_at(&dir, &files);
        no_partials(c.cache(n.0));
    }
    // Pipelining: node 7 (depth 3) had chunks before node 1 (depth 1) had them all.
    let mut events = Vec::new();
    while let Ok(e) = c.events.try_recv() {
        events.push(e);
    }
    let first_of_7 = events
        .iter()
        .position(|e| {
            matches!(
                e,
                StageEvent::Progress {
                    node: NodeId(7),
                    ..
                }
            )
        })
        .expect("node 7 made progress");
    let last_of_1 = events
        .iter()
        .position(
            |e| matches!(e, StageEvent::Progress { node: NodeId(1), next, count } if next == count),
        )
        .expect("node 1 completed");
    assert!(
        first_of_7 < last_of_1,
        "node 7 started only after node 1 finished: not pipelined"
    );

    // Same image again: every node is asked first and skipped.
    let again = stage_image(src.path(), &c.plan(), 2, &key, opts(None))
        .await
        .unwrap();
    assert_eq!(again.digest, s.digest);
    for (n, o) in &again.nodes {
        assert_eq!(*o, StageOutcome::Cached, "{n}");
    }
    // A changed image is a different digest: staged again, side by side.
    std::fs::write(src.path().join("manifest.json"), b"{\"name\":\"v2\"}").unwrap();
    let v2 = stage_image(src.path(), &c.plan(), 3, &key, opts(None))
        .await
        .unwrap();
    assert_ne!(v2.digest, s.digest);
    assert!(v2.nodes.iter().all(|(_, o)| *o == StageOutcome::Staged));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partially_cached_nodes_are_skipped_but_still_forward() {
    let key = JobSecret::generate().unwrap();
    let c = Cluster::start(6, &key, opts(None)).await;
    let src = tempfile::tempdir().unwrap();
    let files = image(src.path(), 1);
    let first = stage_image(src.path(), &c.plan()[..1], 2, &key, opts(None))
        .await
        .unwrap();
    assert_eq!(first.nodes, vec![(NodeId(1), StageOutcome::Staged)]);
    // Node 1 holds it; its children 3 and 4 must still get it through node 1.
    let s = stage_image(src.path(), &c.plan(), 2, &key, opts(None))
        .await
        .unwrap();
    assert_eq!(s.nodes[0], (NodeId(1), StageOutcome::Cached));
    for (n, o) in &s.nodes[1..] {
        assert_eq!(*o, StageOutcome::Staged, "{n}");
        assert_image_at(&c.cache(n.0).join(&s.digest), &files);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_interior_node_is_reported_and_its_subtree_reparented() {
    let key = JobSecret::generate().unwrap();
    // 10 nodes, k = 2: node 1's subtree is 3, 4, 7, 8, 9, 10.
    let rate = Some(8 << 20);
    let mut c = Cluster::start(10, &key, opts(rate)).await;
    let src = tempfile::tempdir().unwrap();
    let files = image(src.path(), 6);
    let plan = c.plan();
    let stage = tokio::spawn({
        let key = key.clone();
        let dir = src.path().to_path_buf();
        async move { stage_image(&dir, &plan, 2, &key, opts(rate)).await }
    });
    // Kill node 1 mid-transfer: after it has a few chunks and its children have started.
    let mut seen_1 = 0;
    let mut child_started = false;
    while seen_1 < 4 || !child_started {
        let e = tokio::time::timeout(Duration::from_secs(30), c.events.recv())
            .await
            .expect("progress within 30 s")
            .unwrap();
        match e {
            StageEvent::Progress {
                node: NodeId(1),
                next,
                count,
            } => {
                assert!(
                    next < count,
                    "node 1 finished before the kill: test too fast"
                );
                seen_1 = next;
            }
            StageEvent::Progress {
                node: NodeId(3), ..
            } => child_started = true,
            _ => {}
        }
    }
    c.servers[0].1.kill();
    eprintln!("killed node 1 after {seen_1} chunks");
    let s = tokio::time::timeout(Duration::from_secs(60), stage)
        .await
        .expect("staging ends")
        .unwrap()
        .unwrap();
    eprintln!("{:#?}", s.nodes);
    match &s.nodes[0] {
        (NodeId(1), StageOutcome::Failed { reason }) => eprintln!("node 1: {reason}"),
        other => panic!("node 1 not reported failed: {other:?}"),
    }
    for (n, o) in &s.nodes[1..] {
        assert_eq!(*o, StageOutcome::Staged, "{n}");
        assert_image_at(&c.cache(n.0).join(&s.digest), &files);
        no_partials(c.cache(n.0));
    }
    // The dead node left no image that looks complete (and, killed in-process, no partial).
    assert!(!c.cache(1).join(&s.digest).exists());
    tokio::time::sleep(Duration::from_millis(200)).await;
    no_partials(c.cache(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_secret_is_rejected() {
    let key = JobSecret::generate().unwrap();
    let mut c = Cluster::start(3, &key, opts(None)).await;
    let src = tempfile::tempdir().unwrap();
    image(src.path(), 1);
    let other = JobSecret::generate().unwrap();
    let s = stage_image(src.path(), &c.plan(), 2, &other, opts(None))
        .await
        .unwrap();
    for (n, o) in &s.nodes {
        assert!(matches!(o, StageOutcome::Failed { .. }), "{n}: {o:?}");
        assert!(!c.cache(n.0).join(&s.digest).exists());
    }
    let mut rejected = 0;
    while let Ok(e) = c.events.try_recv() {
        if matches!(e, StageEvent::Rejected { .. }) {
            rejected += 1;
        }
    }
    assert!(rejected >= 1, "no rejection reported");
}

#[tokio::test]
async fn bad_image_directories_are_clear_errors() {
    let key = JobSecret::generate().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let e = stage_image(empty.path(), &[], 2, &key, opts(None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no files to stage"), "{e}");
    std::fs::create_dir(empty.path().join("sub")).unwrap();
    let e = stage_image(empty.path(), &[], 2, &key, opts(None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("only regular files"), "{e}");
}

/// Forwards connections to `to`; in the first one, flips one byte of what the sender writes
/// once `after` bytes went through. Counts the connections made.
async fn corrupting_proxy(
    to: SocketAddr,
    after: usize,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = std::sync::Arc::new(AtomicUsize::new(0));
    let count = conns.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let first = count.fetch_add(1, Ordering::SeqCst) == 0;
            let server = tokio::net::TcpStream::connect(to).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
            tokio::spawn(async move {
                let (mut seen, mut flipped) = (0usize, !first);
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if !flipped && seen + n > after {
                        buf[after - seen] ^= 0x40;
                        flipped = true;
                    }
                    seen += n;
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, conns)
}

/// A byte of a compressed chunk is damaged on the way to node 1: the frame fails its
/// authentication, the link breaks, the sender dials node 1 again and it resumes from the
/// chunks it verified. Every node ends with the image, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_damaged_in_flight_is_fetched_again() {
    let key = JobSecret::generate().unwrap();
    let c = Cluster::start(3, &key, opts(Some(16 << 20))).await;
    let src = tempfile::tempdir().unwrap();
    let files = mixed_image(src.path(), 4);
    let mut plan = c.plan();
    // Past the offer and the first chunks: inside chunk data, most of it compressed.
    let (proxy, conns) = corrupting_proxy(plan[0].1, 600 << 10).await;
    plan[0].1 = proxy;
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        stage_image(src.path(), &plan, 2, &key, opts(Some(16 << 20))),
    )
    .await
    .expect("staging ends")
    .unwrap();
    assert!(s.data_bytes < s.bytes, "the image must travel compressed");
    for (n, o) in &s.nodes {
        assert_eq!(*o, StageOutcome::Staged, "{n}");
        assert_image_at(&c.cache(n.0).join(&s.digest), &files);
        no_partials(c.cache(n.0));
    }
    assert!(
        conns.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "node 1 was not dialled again after the damaged frame"
    );
}
