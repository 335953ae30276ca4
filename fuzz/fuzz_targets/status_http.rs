//! The status server's HTTP handling (`vse_status::serve_blocking`, what `vse status --serve`
//! runs): a real server on loopback over a real state DB, with a token, receives the fuzzer's
//! bytes as one connection's requests (request line, headers, `Host` check, bearer token and
//! cookie, the login form body, routing). Errors are fine; panics and hangs are not.
//! `Host: 127.0.0.1` passes the Host check (any IP literal does); the token is
//! `fuzz-token-0123456789`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;
use vse_status::auth::Token;
use vse_status::{ServeOptions, serve_blocking};

pub const TOKEN: &str = "fuzz-token-0123456789";

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        vse_fuzz::ignore_sigpipe();
        let dir = tempfile::Builder::new()
            .prefix("vse-status-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let db = dir.join("state.db");
        drop(control::state::StateDb::open(&db).expect("state db"));
        let opts = ServeOptions {
            db,
            addr: (Ipv4Addr::LOCALHOST, 0).into(),
            token: Some(Token::new(TOKEN)),
            period: Duration::from_secs(1),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = serve_blocking(opts, |a| {
                let _ = tx.send(a);
            });
            panic!("the status server stopped: {r:?}");
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("status server up")
    })
}

fuzz_target!(|data: &[u8]| {
    let addr = server();
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = s.write_all(data);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut buf = [0u8; 64 << 10];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
});
