//! The node image cache is trusted only as far as it must be: a planted entry with the right
//! name and sizes but other bytes is not used (the image is staged again and the node ends up
//! with the sender's bytes), and a cache directory another user could write into is refused.
//! Real staging servers of this process, real sockets, real files.

use agents::{proto::NodeId, secret::JobSecret};
use launcher::stage::{
    StageError, StageEvent, StageOptions, StageOutcome, StageServer, UnsafeCache, stage_image,
};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;

fn opts() -> StageOptions {
    StageOptions {
        chunk_size: 64 << 10,
        heartbeat: Duration::from_millis(100),
        timeout: Duration::from_secs(5),
        ..StageOptions::default()
    }
}

fn sha(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

async fn server(
    cache: &Path,
    key: &JobSecret,
) -> (StageServer, mpsc::UnboundedReceiver<StageEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let s = StageServer::start(
        "127.0.0.1".parse().unwrap(),
        NodeId(1),
        key.clone(),
        cache.to_path_buf(),
        opts(),
        Some(tx),
    )
    .await
    .unwrap();
    (s, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_same_size_image_is_not_taken_for_the_real_one() {
    let key = JobSecret::generate().unwrap();
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("manifest.json"), b"{\"name\":\"real\"}").unwrap();
    let real: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("root.ext4"), &real).unwrap();
    let cache = root.path().join("cache");
    let (srv, mut events) = server(&cache, &key).await;
    let plan = [(NodeId(1), srv.addr)];

    // The first run stages the image; note its digest (the entry's name).
    let first = stage_image(&src, &plan, 2, &key, opts()).await.unwrap();
    assert_eq!(first.nodes, vec![(NodeId(1), StageOutcome::Staged)]);
    let entry = cache.join(&first.digest);
    let want = sha(&src.join("root.ext4"));
    assert_eq!(sha(&entry.join("root.ext4")), want);

    // Another image of the same size planted under the same name, as a local attacker would.
    let mut evil = real.clone();
    evil[1000] ^= 0xff;
    evil[200_000] ^= 0x5a;
    std::fs::write(entry.join("root.ext4"), &evil).unwrap();
    assert_ne!(sha(&entry.join("root.ext4")), want);

    let again = stage_image(&src, &plan, 2, &key, opts()).await.unwrap();

    // Not a cache hit: staged again, and the node now holds the sender's bytes.
    assert_eq!(again.digest, first.digest);
    assert_eq!(again.nodes, vec![(NodeId(1), StageOutcome::Staged)]);
    assert_eq!(sha(&entry.join("root.ext4")), want);
    let mut discarded = false;
    while let Ok(e) = events.try_recv() {
        discarded |= matches!(e, StageEvent::Discarded { ref dir, .. } if *dir == entry);
    }
    assert!(discarded, "the planted entry was not reported discarded");
    // And a third run, with the cache now right, is a (verified) hit.
    let third = stage_image(&src, &plan, 2, &key, opts()).await.unwrap();
    assert_eq!(third.nodes, vec![(NodeId(1), StageOutcome::Cached)]);
}

fn refused(e: StageError) -> UnsafeCache {
    match e {
        StageError::UnsafeCache(u) => u,
        other => panic!("expected an unsafe-cache refusal, got {other}"),
    }
}

#[tokio::test]
async fn a_cache_others_can_write_is_refused() {
    let key = JobSecret::generate().unwrap();
    let root = tempfile::tempdir().unwrap();
    let start = |dir: std::path::PathBuf| {
        let key = key.clone();
        async move {
            StageServer::start(
                "127.0.0.1".parse().unwrap(),
                NodeId(1),
                key,
                dir,
                opts(),
                None,
            )
            .await
        }
    };

    // Created by staging: 0700.
    let fresh = root.path().join("a/b/images");
    drop(start(fresh.clone()).await.unwrap());
    for d in [root.path().join("a"), fresh.clone()] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }

    // Group-writable: refused, naming the directory and the fix.
    let group = root.path().join("group");
    std::fs::create_dir(&group).unwrap();
    std::fs::set_permissions(&group, std::fs::Permissions::from_mode(0o770)).unwrap();
    let e = refused(start(group.clone()).await.err().expect("refused"));
    let text = e.to_string();
    assert!(matches!(e, UnsafeCache::Writable { .. }), "{text}");
    assert!(
        text.contains(&group.display().to_string()) && text.contains("chmod go-w"),
        "{text}"
    );

    // World-writable, even with the sticky bit: refused.
    let world = root.path().join("world");
    std::fs::create_dir(&world).unwrap();
    std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = refused(start(world.clone()).await.err().expect("refused"));
    assert!(matches!(e, UnsafeCache::Writable { .. }), "{e}");

    // Inside a directory another user may change: refused.
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(start(open.join("images")).await.err().expect("refused"));
    assert!(matches!(e, UnsafeCache::Ancestor { .. }), "{e}");

    // Owned by another user (needs root to make one).
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let require = testkit::require(me == 0, "root", "run the tests as root (chown)");
    if !require {
        return;
    }
    let foreign = root.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    let e = refused(start(foreign.clone()).await.err().expect("refused"));
    let text = e.to_string();
    assert!(
        matches!(e, UnsafeCache::Owner { owner: 65534, .. }),
        "{text}"
    );
    assert!(text.contains(&foreign.display().to_string()), "{text}");
}
