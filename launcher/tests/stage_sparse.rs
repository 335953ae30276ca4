//! Only real bytes travel and land: a staged copy is sparse where the image is zero (holes and
//! written zeros alike), byte-identical to the source, and a chunk whose bytes (raw, or what
//! they decompress to) do not match the offer's chunk table is refused. Real staging servers
//! of this process, real sockets, real files; the refusals come from an authenticated sender
//! that lies, as a faulty or compromised node would.

use agents::{proto, proto::NodeId, secret::JobSecret};
use launcher::stage::{
    Encoding, Layout, StageOptions, StageOutcome, StageServer, stage_image, wire::StageMsg,
};
use sha2::{Digest, Sha256};
use std::{
    fs::File,
    io::Write,
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    time::Duration,
};

const CHUNK: u64 = 256 << 10;

fn opts() -> StageOptions {
    StageOptions {
        chunk_size: CHUNK,
        heartbeat: Duration::from_millis(100),
        timeout: Duration::from_secs(5),
        ..StageOptions::default()
    }
}

fn sha(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

fn noise(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A 16 MiB root file with 1.5 MiB of data: holes, 4 MiB of zeros written out (allocated at
/// the source), text and noise. Returns the bytes of data.
fn sparse_image(dir: &Path) -> u64 {
    std::fs::write(dir.join("manifest.json"), b"{\"name\":\"sparse\"}").unwrap();
    let f = File::create(dir.join("root.ext4")).unwrap();
    f.set_len(16 << 20).unwrap();
    f.write_all_at(&vec![0u8; 4 << 20], 2 << 20).unwrap();
    let text = b"superblock inode table ".repeat(512 << 10 >> 4);
    f.write_all_at(&text[..512 << 10], 0).unwrap();
    f.write_all_at(&noise(512 << 10, 7), 8 << 20).unwrap();
    // A chunk with data in one block only: the rest of it must stay holes too.
    f.write_all_at(b"tail", (12 << 20) + 8192).unwrap();
    let mut k = File::create(dir.join("vmlinuz")).unwrap();
    k.write_all(&noise(300_001, 3)).unwrap();
    (512 << 10) + (512 << 10) + 4096 + 300_001 + 17
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_copies_are_sparse_and_identical() {
    let key = JobSecret::generate().unwrap();
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let data = sparse_image(&src);
    // 3 nodes, k = 1: node 3 gets every chunk relayed by nodes 1 and 2.
    let mut servers = Vec::new();
    for i in 1..=3 {
        let (cache, s) = server(root.path(), &format!("node{i}"), i, &key).await;
        servers.push((NodeId(i), s, cache));
    }
    let plan: Vec<_> = servers.iter().map(|(n, s, _)| (*n, s.addr)).collect();

    let s = stage_image(&src, &plan, 1, &key, opts()).await.unwrap();

    assert!(
        s.nodes.iter().all(|(_, o)| *o == StageOutcome::Staged),
        "{:?}",
        s.nodes
    );
    // Only chunks with data were sent: 3 of 64 root chunks plus the kernel and manifest.
    assert!(s.data_bytes < 3 << 20, "sent {} bytes", s.data_bytes);
    for (_, _, cache) in &servers {
        let dir = cache.join(&s.digest);
        for f in ["manifest.json", "root.ext4", "vmlinuz"] {
            assert_eq!(sha(&dir.join(f)), sha(&src.join(f)), "{}", dir.display());
        }
        let root_fs = dir.join("root.ext4");
        assert_eq!(std::fs::metadata(&root_fs).unwrap().len(), 16 << 20);
        let (got, src_alloc) = (allocated(&root_fs), allocated(&src.join("root.ext4")));
        // The source has 5 MiB allocated (the zeros were written); the copy only its data,
        // give or take the file system's metadata blocks.
        assert!(src_alloc >= 5 << 20, "source allocation {src_alloc}");
        assert!(
            got <= (1 << 20) + (64 << 10),
            "{}: {got} bytes allocated for about {} of data",
            root_fs.display(),
            (1 << 20) + 4096
        );
    }
    assert!(data > 0);
}

/// Node `node`'s staging server with its own empty cache `root/name`.
async fn server(root: &Path, name: &str, node: u32, key: &JobSecret) -> (PathBuf, StageServer) {
    let cache = root.join(name);
    let srv = StageServer::start(
        "127.0.0.1".parse().unwrap(),
        NodeId(node),
        key.clone(),
        cache.clone(),
        opts(),
        None,
    )
    .await
    .unwrap();
    (cache, srv)
}

/// Connects to `srv` as an authenticated sender offering the image in `src`, and returns the
/// link and the first data chunk's index and bytes.
async fn lying_sender(
    srv: &StageServer,
    key: &JobSecret,
    src: &Path,
) -> (proto::LinkTx, proto::LinkRx, String, u64, Vec<u8>) {
    let layout = Layout::from_dir(src, CHUNK).unwrap();
    let table = layout.table_of(src).unwrap();
    let digest = layout.digest(&table);
    let offer = StageMsg::Offer {
        digest: digest.clone(),
        files: layout.files(),
        chunk_size: CHUNK,
        table: table.iter().map(|c| c.map(hex::encode)).collect(),
        k: 2,
        nodes: vec![(NodeId(1), srv.addr)],
    };
    let stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let (tx, rx, answer) = proto::connect(stream, key, &offer, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            StageMsg::Have {
                next: 0,
                complete: false
            }
        ),
        "{answer:?}"
    );
    let first = table.iter().position(Option::is_some).unwrap() as u64;
    let files = layout.open_all(src, false).unwrap();
    let data = layout.read_chunk(&files, first, src).unwrap().unwrap();
    (tx, rx, digest, first, data)
}

/// Reads frames until the server's report, and returns its failure reason.
async fn refusal(rx: &mut proto::LinkRx) -> String {
    loop {
        let (m, _) = tokio::time::timeout(Duration::from_secs(10), rx.recv::<StageMsg>())
            .await
            .expect("an answer within 10 s")
            .expect("the server answers before closing");
        match m {
            StageMsg::Have { .. } => continue,
            StageMsg::Report { nodes } => match &nodes[..] {
                [(NodeId(1), StageOutcome::Failed { reason })] => return reason.clone(),
                other => panic!("expected node 1's failure, got {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn nothing_published(cache: &Path, digest: &str) {
    assert!(
        !cache.join(digest).exists(),
        "a refused image was published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_and_wrongly_compressed_chunks_are_refused() {
    let key = JobSecret::generate().unwrap();
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("src");
    std::fs::create_dir(&src).unwrap();
    sparse_image(&src);

    // A raw chunk with one byte changed.
    let (cache, srv) = server(root.path(), "a", 1, &key).await;
    let (mut tx, mut rx, digest, index, mut data) = lying_sender(&srv, &key, &src).await;
    data[1234] ^= 0x20;
    let msg = StageMsg::Chunk {
        digest: digest.clone(),
        index,
        encoding: Encoding::Raw,
    };
    tx.send_blob(&msg, &data).await.unwrap();
    let why = refusal(&mut rx).await;
    assert!(
        why.contains("SHA-256") && why.contains(&format!("chunk {index}")),
        "{why}"
    );
    nothing_published(&cache, &digest);

    // A valid zstd frame of other bytes of the right length.
    let (cache, srv) = server(root.path(), "b", 1, &key).await;
    let (mut tx, mut rx, digest, index, mut data) = lying_sender(&srv, &key, &src).await;
    data[0] ^= 1;
    let packed = zstd::bulk::compress(&data, 1).unwrap();
    assert!(
        packed.len() < data.len() / 4,
        "the test chunk must compress"
    );
    let msg = StageMsg::Chunk {
        digest: digest.clone(),
        index,
        encoding: Encoding::Zstd,
    };
    tx.send_blob(&msg, &packed).await.unwrap();
    let why = refusal(&mut rx).await;
    assert!(why.contains("SHA-256"), "{why}");
    nothing_published(&cache, &digest);

    // Bytes that are not zstd at all, flagged as zstd.
    let (cache, srv) = server(root.path(), "c", 1, &key).await;
    let (mut tx, mut rx, digest, index, data) = lying_sender(&srv, &key, &src).await;
    let msg = StageMsg::Chunk {
        digest: digest.clone(),
        index,
        encoding: Encoding::Zstd,
    };
    tx.send_blob(&msg, &data).await.unwrap();
    let why = refusal(&mut rx).await;
    assert!(why.contains("zstd"), "{why}");
    nothing_published(&cache, &digest);
}
