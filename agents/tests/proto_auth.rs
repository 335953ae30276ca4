//! Unauthenticated, tampered and replayed frames are rejected over real TCP connections.

use agents::{
    proto::{Direction, NodeId, ProtoError, accept, connect, encode_frame},
    secret::JobSecret,
};
use std::time::Duration;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const D: Duration = Duration::from_secs(5);
/// The raw client below dials, so its frames travel to the acceptor.
const TO: Direction = Direction::ToAcceptor;

type Msg = agents::proto::Msg<()>;

fn hello() -> Msg {
    Msg::Hello {
        id: NodeId(1),
        listen: "127.0.0.1:1".parse().unwrap(),
    }
}

async fn listener() -> (TcpListener, std::net::SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[tokio::test]
async fn good_secret_passes_both_ways() {
    let key = JobSecret::generate().unwrap();
    let (l, addr) = listener().await;
    let k2 = key.clone();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (mut tx, mut rx, first) = accept::<Msg>(s, &k2, D).await.unwrap();
        assert_eq!(first, hello());
        tx.send(&Msg::Welcome { id: NodeId(0) }).await.unwrap();
        rx.recv().await.unwrap()
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut tx, _rx, answer) = connect(s, &key, &hello(), D).await.unwrap();
    assert_eq!(answer, Msg::Welcome { id: NodeId(0) });
    tx.send_blob(&Msg::Ping { seq: 9 }, b"data").await.unwrap();
    assert_eq!(
        server.await.unwrap(),
        (Msg::Ping { seq: 9 }, b"data".to_vec())
    );
}

#[tokio::test]
async fn wrong_secret_is_rejected() {
    let (l, addr) = listener().await;
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        accept::<Msg>(s, &JobSecret::generate().unwrap(), D)
            .await
            .err()
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let client = connect(s, &JobSecret::generate().unwrap(), &hello(), D).await;
    assert!(matches!(server.await.unwrap(), Some(ProtoError::BadMac)));
    assert!(client.is_err(), "client gets no authenticated answer");
}

/// A raw client that speaks the protocol by hand, to send exactly the bytes a test wants.
async fn raw_session(
    key: &JobSecret,
    frames: impl Fn(&[u8; 16]) -> Vec<Vec<u8>>,
) -> Vec<Result<Msg, ProtoError>> {
    let (l, addr) = listener().await;
    let k2 = key.clone();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        match accept(s, &k2, D).await {
            Ok((_tx, mut rx, first)) => {
                got.push(Ok(first));
                loop {
                    match rx.recv().await {
                        Ok((m, _)) => got.push(Ok(m)),
                        Err(ProtoError::Closed) => break,
                        Err(e) => {
                            got.push(Err(e));
                            break;
                        }
                    }
                }
            }
            Err(e) => got.push(Err(e)),
        }
        got
    });
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[1u8; 16]).await.unwrap();
    let mut server_nonce = [0u8; 16];
    s.read_exact(&mut server_nonce).await.unwrap();
    for f in frames(&server_nonce) {
        s.write_all(&f).await.unwrap();
    }
    drop(s);
    server.await.unwrap()
}

#[tokio::test]
async fn tampered_frame_is_rejected() {
    let key = JobSecret::generate().unwrap();
    let got = raw_session(&key, |n| {
        let mut f = encode_frame(&key, n, TO, 0, &hello(), &[]).unwrap();
        let last_json = f.len() - 33;
        f[last_json] ^= 0x20;
        vec![f]
    })
    .await;
    assert_eq!(got.len(), 1);
    assert!(matches!(got[0], Err(ProtoError::BadMac)), "{got:?}");
}

#[tokio::test]
async fn replayed_frame_is_rejected() {
    let key = JobSecret::generate().unwrap();
    let got = raw_session(&key, |n| {
        let f0 = encode_frame(&key, n, TO, 0, &hello(), &[]).unwrap();
        let f1 = encode_frame(&key, n, TO, 1, &Msg::Ping { seq: 1 }, &[]).unwrap();
        vec![f0, f1.clone(), f1]
    })
    .await;
    assert_eq!(got[0].as_ref().ok(), Some(&hello()), "{got:?}");
    assert_eq!(got[1].as_ref().ok(), Some(&Msg::Ping { seq: 1 }), "{got:?}");
    assert!(
        matches!(
            got[2],
            Err(ProtoError::Replay {
                expected: 2,
                got: 1
            })
        ),
        "{got:?}"
    );
}

#[tokio::test]
async fn frame_from_another_connection_is_rejected() {
    let key = JobSecret::generate().unwrap();
    // Recorded against a different challenge nonce: valid MAC there, worthless here.
    let stale = encode_frame(&key, &[9u8; 16], TO, 0, &hello(), &[]).unwrap();
    let got = raw_session(&key, |_| vec![stale.clone()]).await;
    assert!(matches!(got[0], Err(ProtoError::BadMac)), "{got:?}");
}

#[tokio::test]
async fn frame_reflected_to_its_sender_is_rejected() {
    // A frame the acceptor would send (MACed over the dialer's nonce, towards the dialer) is
    // what a reflecting peer would bounce back at us: it must not pass as ours.
    let key = JobSecret::generate().unwrap();
    let got = raw_session(&key, |n| {
        vec![encode_frame(&key, n, Direction::ToDialer, 0, &hello(), &[]).unwrap()]
    })
    .await;
    assert!(matches!(got[0], Err(ProtoError::BadMac)), "{got:?}");
}

#[tokio::test]
async fn a_peer_that_echoes_our_nonce_is_refused() {
    let key = JobSecret::generate().unwrap();
    let (l, addr) = listener().await;
    // The "peer" reads our nonce and sends it straight back, then reflects whatever we send.
    let mirror = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut n = [0u8; 16];
        s.read_exact(&mut n).await.unwrap();
        s.write_all(&n).await.unwrap();
        let mut buf = vec![0u8; 4096];
        while let Ok(k) = s.read(&mut buf).await {
            if k == 0 || s.write_all(&buf[..k]).await.is_err() {
                break;
            }
        }
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let r = connect(s, &key, &hello(), D).await;
    assert!(matches!(r, Err(ProtoError::EchoedNonce)), "{:?}", r.err());
    mirror.abort();
}
