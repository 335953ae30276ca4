//! Getting bytes from `http(s)://` and `file://` URLs, with bounded retries, plus a
//! content-addressed cache so that a warm rerun works offline.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error(
        "{url}: unreachable after {attempts} attempts: {message} (check the mirror URL and the network, or run with a warm cache)"
    )]
    Unreachable {
        url: String,
        attempts: u32,
        message: String,
    },
    #[error("unsupported URL scheme in `{url}`: expected http://, https:// or file://")]
    Scheme { url: String },
}

/// How often and how long to try a URL.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub timeout: Duration,
    pub backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            timeout: Duration::from_secs(30),
            backoff: Duration::from_millis(300),
        }
    }
}

pub struct Fetcher {
    client: Option<reqwest::blocking::Client>,
    retry: RetryPolicy,
}

impl Fetcher {
    pub fn new(retry: RetryPolicy) -> Fetcher {
        Fetcher {
            client: None,
            retry,
        }
    }

    fn client(&mut self) -> Result<&reqwest::blocking::Client, reqwest::Error> {
        if self.client.is_none() {
            let c = reqwest::blocking::Client::builder()
                .timeout(self.retry.timeout)
                .connect_timeout(self.retry.timeout)
                .user_agent(concat!("vse/", env!("CARGO_PKG_VERSION")))
                .build()?;
            self.client = Some(c);
        }
        Ok(self.client.as_ref().expect("just set"))
    }

    pub fn get(&mut self, url: &str) -> Result<Vec<u8>, FetchError> {
        if let Some(path) = url.strip_prefix("file://") {
            return std::fs::read(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => FetchError::NotFound {
                    url: url.to_string(),
                },
                _ => FetchError::Unreachable {
                    url: url.to_string(),
                    attempts: 1,
                    message: e.to_string(),
                },
            });
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(FetchError::Scheme {
                url: url.to_string(),
            });
        }
        let attempts = self.retry.attempts.max(1);
        let backoff = self.retry.backoff;
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                std::thread::sleep(backoff * 2u32.pow(attempt - 1));
            }
            let client = self.client().map_err(|e| FetchError::Unreachable {
                url: url.to_string(),
                attempts: 0,
                message: e.to_string(),
            })?;
            match client.get(url).send() {
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    return Err(FetchError::NotFound {
                        url: url.to_string(),
                    });
                }
                // Other client errors will not change on retry.
                Ok(r) if r.status().is_client_error() => {
                    return Err(FetchError::Unreachable {
                        url: url.to_string(),
                        attempts: attempt + 1,
                        message: format!("HTTP {}", r.status()),
                    });
                }
                Ok(r) if r.status().is_success() => match r.bytes() {
                    Ok(b) => return Ok(b.to_vec()),
                    Err(e) => last = e.to_string(),
                },
                Ok(r) => last = format!("HTTP {}", r.status()),
                Err(e) => last = error_chain(&e),
            }
        }
        Err(FetchError::Unreachable {
            url: url.to_string(),
            attempts,
            message: last,
        })
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Index files stored by their SHA256 (`<dir>/sha256/<hash>`), and signed Release files by
/// URL (`<dir>/release/<sha256 of url>`): the latter are re-verified on every use.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    pub fn new(dir: &Path) -> Cache {
        Cache {
            dir: dir.to_path_buf(),
        }
    }

    /// The default location: `<cache root>/debian` (see [`vse_base::cache_root`]).
    pub fn default_dir() -> Option<PathBuf> {
        Some(vse_base::cache_root().join("debian"))
    }

    fn by_hash(&self, sha256: &str) -> PathBuf {
        self.dir.join("sha256").join(sha256)
    }

    /// Cached content whose hash still matches (a corrupted entry is ignored).
    pub fn get(&self, sha256: &str) -> Option<Vec<u8>> {
        let data = std::fs::read(self.by_hash(sha256)).ok()?;
        (sha256_hex(&data) == sha256).then_some(data)
    }

    pub fn put(&self, sha256: &str, data: &[u8]) -> std::io::Result<()> {
        write_atomic(&self.by_hash(sha256), data)
    }

    fn release_path(&self, url: &str) -> PathBuf {
        self.dir.join("release").join(sha256_hex(url.as_bytes()))
    }

    pub fn get_release(&self, url: &str) -> Option<Vec<u8>> {
        std::fs::read(self.release_path(url)).ok()
    }

    pub fn put_release(&self, url: &str, data: &[u8]) -> std::io::Result<()> {
        write_atomic(&self.release_path(url), data)
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, data)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
