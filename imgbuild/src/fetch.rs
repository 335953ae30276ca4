//! The package cache: every locked `.deb`, downloaded once into a content-addressed store
//! (`<cache>/debs/<sha256>.deb`) shared by all builds, verified (size + SHA256) before use.
//!
//! Downloads run on a bounded pool of threads, resume from a `.partial` file with an HTTP
//! Range request, and retry with exponential backoff. `file://` URLs are copied, so a CI
//! cache filled with `apt-get download` works as a repository too.

use crate::deb::DebFile;
use crate::progress::{Event, Progress};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

const ATTEMPTS: u32 = 4;
const _: () = assert!(ATTEMPTS > 0);

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: download failed after {ATTEMPTS} attempts: {last}")]
    Download { url: String, last: AttemptError },
    #[error(
        "{url}: expected {expected} bytes with SHA256 {sha256}, got {got_size} bytes with SHA256 {got_sha256}; the mirror and the lock disagree (re-run `vse lock`?)"
    )]
    Mismatch {
        url: String,
        expected: u64,
        sha256: String,
        got_size: u64,
        got_sha256: String,
    },
    #[error("{0:?} is not a valid SHA256 (64 hex digits) in the lock")]
    BadHash(String),
    #[error("package cache {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot create the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error(transparent)]
    Unsafe(#[from] vse_base::Unsafe),
}

/// Why one download attempt failed; the last one is reported once the retries are spent.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The whole file arrived but is not what the lock says.
    #[error(transparent)]
    Mismatch(Box<FetchError>),
}

/// This crate's rule for a poisoned lock: recover the guard. The queue and the first error stay
/// consistent whatever a panicking download thread did.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One file to fetch: where from, and what it must be.
#[derive(Debug, Clone)]
pub struct Want {
    pub url: String,
    pub size: u64,
    pub sha256: String,
    pub name: String,
}

/// The content-addressed `.deb` store.
#[derive(Debug, Clone)]
pub struct DebCache {
    dir: PathBuf,
}

impl DebCache {
    /// `<root>/debs`, `root` and it made or checked private to this user (nobody else may
    /// plant a file there; see [`vse_base`]).
    pub fn open(root: &Path) -> Result<Self, FetchError> {
        vse_base::private_dir(root, "build cache (VSE_CACHE)")?;
        let dir = root.join("debs");
        vse_base::private_dir(&dir, "package cache (VSE_CACHE)")?;
        Ok(DebCache { dir })
    }

    pub fn default_root() -> PathBuf {
        vse_base::cache_root()
    }

    pub fn path_of(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}.deb"))
    }

    /// Makes every wanted file present and verified; returns them in order, each with the
    /// size and SHA256 it must still have when it is read ([`crate::deb::read_deb`] checks
    /// the bytes it unpacks: a cache file is never trusted by its location).
    pub fn fetch_all(
        &self,
        wants: &[Want],
        jobs: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<DebFile>, FetchError> {
        for w in wants {
            if w.sha256.len() != 64 || !w.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(FetchError::BadHash(w.sha256.clone()));
            }
        }
        progress.event(Event::FetchStart {
            files: wants.len(),
            bytes: wants.iter().map(|w| w.size).sum(),
        });
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            .timeout(Duration::from_secs(600))
            .user_agent(concat!("vse-imgbuild/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(FetchError::Client)?;
        let queue = Mutex::new(wants.iter().collect::<Vec<_>>());
        let first_error = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..jobs.clamp(1, 16) {
                s.spawn(|| {
                    loop {
                        let Some(w) = lock(&queue).pop() else {
                            return;
                        };
                        if let Err(e) = self.fetch_one(&client, w, progress) {
                            lock(&first_error).get_or_insert(e);
                            lock(&queue).clear(); // stop early
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        progress.event(Event::FetchDone);
        Ok(wants
            .iter()
            .map(|w| DebFile {
                path: self.path_of(&w.sha256),
                size: w.size,
                sha256: w.sha256.clone(),
            })
            .collect())
    }

    fn fetch_one(
        &self,
        client: &reqwest::blocking::Client,
        w: &Want,
        progress: &dyn Progress,
    ) -> Result<(), FetchError> {
        let dest = self.path_of(&w.sha256);
        // Builds running at once share the store: one of them downloads a file while the
        // others wait, then find it in place (a `.partial` written by two would be garbage).
        let _turn = self.turn(&w.sha256)?;
        if dest.exists() {
            // A cached file is trusted only after the same check as a fresh download.
            if self.verify(&dest, w).is_ok() {
                progress.event(Event::FetchFile {
                    name: w.name.clone(),
                    bytes: w.size,
                    cached: true,
                });
                return Ok(());
            }
            let _ = std::fs::remove_file(&dest);
        }
        let partial = self.dir.join(format!("{}.partial", w.sha256));
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500 << attempt));
            }
            match self.download(client, w, &partial) {
                Ok(()) => match self.verify(&partial, w) {
                    Ok(()) => {
                        std::fs::rename(&partial, &dest).map_err(|source| FetchError::Io {
                            path: dest.clone(),
                            source,
                        })?;
                        progress.event(Event::FetchFile {
                            name: w.name.clone(),
                            bytes: w.size,
                            cached: false,
                        });
                        return Ok(());
                    }
                    Err(e) => {
                        // A complete but wrong file will not get better by resuming it.
                        let _ = std::fs::remove_file(&partial);
                        if attempt + 1 == ATTEMPTS {
                            return Err(e);
                        }
                        last = Some(AttemptError::Mismatch(Box::new(e)));
                    }
                },
                Err(e) => last = Some(e),
            }
        }
        Err(FetchError::Download {
            url: w.url.clone(),
            last: last.expect("ATTEMPTS > 0, so at least one attempt failed"),
        })
    }

    /// This process's exclusive turn at the file `sha256`: a lock on `<sha256>.lock` (never
    /// renamed or removed, so every process locks the same inode), dropped with the returned
    /// descriptor, or by the kernel when the process dies.
    fn turn(&self, sha256: &str) -> Result<File, FetchError> {
        let path = self.dir.join(format!("{sha256}.lock"));
        let io = |source| FetchError::Io {
            path: path.clone(),
            source,
        };
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io)?;
        f.lock().map_err(io)?;
        Ok(f)
    }

    /// Appends the missing tail of `w` to `partial`.
    fn download(
        &self,
        client: &reqwest::blocking::Client,
        w: &Want,
        partial: &Path,
    ) -> Result<(), AttemptError> {
        if let Some(path) = w.url.strip_prefix("file://") {
            std::fs::copy(path, partial).map_err(|source| AttemptError::File {
                path: path.into(),
                source,
            })?;
            return Ok(());
        }
        let have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
        if have >= w.size {
            return Ok(());
        }
        let mut req = client.get(&w.url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let mut resp = req.send()?;
        let status = resp.status();
        let append = match status.as_u16() {
            206 => true,
            200 => false,
            _ => return Err(AttemptError::Status(status)),
        };
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(partial)
            .map_err(|source| AttemptError::File {
                path: partial.into(),
                source,
            })?;
        // Never store more than the lock says: a hostile mirror cannot fill the disk.
        let mut limited = (&mut resp).take(w.size + 1 - if append { have } else { 0 });
        io::copy(&mut limited, &mut f)?;
        f.flush()?;
        Ok(())
    }

    fn verify(&self, path: &Path, w: &Want) -> Result<(), FetchError> {
        let (size, sha) = hash_file(path).map_err(|source| FetchError::Io {
            path: path.into(),
            source,
        })?;
        if size != w.size || !sha.eq_ignore_ascii_case(&w.sha256) {
            return Err(FetchError::Mismatch {
                url: w.url.clone(),
                expected: w.size,
                sha256: w.sha256.clone(),
                got_size: size,
                got_sha256: sha,
            });
        }
        Ok(())
    }
}

/// Size and hex SHA256 of a file. A sparse file's holes are hashed as the zeros they read
/// as, without reading them: a root disk is mostly free space, and the kernel would otherwise
/// zero-fill every page of it only for the hash to read it back.
pub fn hash_file(path: &Path) -> io::Result<(u64, String)> {
    let f = File::open(path)?;
    match hash_sparse(&f) {
        Some(r) => r,
        None => hash_stream(f),
    }
}

/// `None` when the file system cannot tell holes from data (then read it all).
fn hash_sparse(f: &File) -> Option<io::Result<(u64, String)>> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return Some(Err(e)),
    };
    let seek = |from: u64, whence: i32| -> io::Result<u64> {
        // SAFETY: lseek on a descriptor this function borrows; no memory is passed.
        let r = unsafe { libc::lseek(f.as_raw_fd(), from as libc::off_t, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    };
    // Probe once: a file system without SEEK_DATA says EINVAL.
    if len > 0
        && let Err(e) = seek(0, libc::SEEK_DATA)
        && e.raw_os_error() != Some(libc::ENXIO)
    {
        return None;
    }
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    let mut buf = vec![0u8; CHUNK];
    let mut h = Sha256::new();
    let mut pos = 0u64;
    let run = (|| -> io::Result<()> {
        while pos < len {
            let data = match seek(pos, libc::SEEK_DATA) {
                Ok(d) => d.min(len),
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => len,
                Err(e) => return Err(e),
            };
            while pos < data {
                let n = (data - pos).min(CHUNK as u64) as usize;
                h.update(&zeros[..n]);
                pos += n as u64;
            }
            if pos >= len {
                break;
            }
            let hole = seek(pos, libc::SEEK_HOLE)?.min(len);
            while pos < hole {
                let n = (hole - pos).min(CHUNK as u64) as usize;
                f.read_exact_at(&mut buf[..n], pos)?;
                h.update(&buf[..n]);
                pos += n as u64;
            }
        }
        Ok(())
    })();
    Some(run.map(|()| (len, hex::encode(h.finalize()))))
}

fn hash_stream(mut f: File) -> io::Result<(u64, String)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((size, hex::encode(h.finalize())))
}

/// SHA256 of bytes in memory, lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Holes at the start, between data and at the end hash as the zeros they read as.
    #[test]
    fn a_sparse_file_hashes_like_its_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sparse");
        let f = File::create(&p).unwrap();
        f.set_len(9 << 20).unwrap();
        f.write_all_at(b"data in the middle", 3 << 20).unwrap();
        f.write_all_at(&[7u8; 70_000], (5 << 20) + 123).unwrap();
        drop(f);
        let bytes = std::fs::read(&p).unwrap();
        let want = (bytes.len() as u64, sha256_hex(&bytes));
        assert_eq!(hash_file(&p).unwrap(), want);
        assert_eq!(hash_stream(File::open(&p).unwrap()).unwrap(), want);
        let empty = d.path().join("empty");
        File::create(&empty).unwrap();
        assert_eq!(hash_file(&empty).unwrap(), (0, sha256_hex(b"")));
    }

    /// Builds that fetch the same file at once each end with the whole file.
    #[test]
    fn concurrent_fetches_of_one_file_all_get_it_whole() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("pkg.deb");
        let bytes: Vec<u8> = (0..(16u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &bytes).unwrap();
        let want = Want {
            url: format!("file://{}", src.display()),
            size: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
            name: "pkg".into(),
        };
        let root = d.path().join("cache");
        let results: Vec<_> = std::thread::scope(|s| {
            let all: Vec<_> = (0..6)
                .map(|_| {
                    let (root, want) = (&root, &want);
                    s.spawn(move || {
                        let cache = DebCache::open(root)?;
                        cache.fetch_all(std::slice::from_ref(want), 1, &crate::progress::Silent)
                    })
                })
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            let files = r.expect("every fetch succeeds");
            assert_eq!(
                hash_file(&files[0].path).unwrap(),
                (want.size, want.sha256.clone())
            );
        }
    }
}
