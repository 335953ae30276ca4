//! A directory served over HTTP/1.0 on 127.0.0.1 (GET only, 404 for what is missing), for
//! tests that point vse at an archive of their own. Stops when dropped.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct ServedDir {
    pub url: String,
    alive: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedDir {
    pub fn start(root: PathBuf) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let alive = Arc::new(AtomicBool::new(true));
        let on = alive.clone();
        let thread = std::thread::spawn(move || {
            while on.load(Ordering::SeqCst) {
                let Ok((mut s, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                let mut line = String::new();
                if BufReader::new(&s).read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                let file = root.join(path.trim_start_matches('/'));
                match std::fs::read(&file).ok().filter(|_| !path.contains("..")) {
                    Some(b) => {
                        let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", b.len());
                        let _ = s.write_all(&b);
                    }
                    None => {
                        let _ = write!(s, "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                    }
                }
            }
        });
        ServedDir {
            url,
            alive,
            thread: Some(thread),
        }
    }
}

impl Drop for ServedDir {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
