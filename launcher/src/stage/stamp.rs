//! Remembered verifications. Hashing an image costs a full read (a second or more for the
//! MPI image), and every launch needs its digest at the front-end and on every node that
//! already caches it. A stamp next to the image (a hidden sibling: `.<name>.verified`, outside
//! the image's own files) records the digest, the chunk table and each file's identity —
//! device, inode, size, and change time, which only the kernel sets and any write moves. A
//! later check whose files still have those identities takes the stamp instead of reading.
//!
//! A stamp is only written for files whose last change is safely before the read began (the
//! kernel's change times are coarse, so a write racing the read could keep its time), and it
//! is never a weaker check than what follows it: nodes verify every chunk they receive
//! against the table, and a stamp that lies about the table makes staging fail, not succeed.

use super::layout::{ChunkHash, Layout};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long before the read a file must have last changed for its stamp to be written.
const SETTLED: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    name: String,
    dev: u64,
    ino: u64,
    size: u64,
    ctime_ns: i128,
}

#[derive(Debug, Serialize, Deserialize)]
struct Stamp {
    version: u32,
    chunk: u64,
    digest: String,
    /// Hex SHA-256 of each chunk, `None` for a hole.
    table: Vec<Option<String>>,
    files: Vec<Identity>,
}

const VERSION: u32 = 1;

/// Where the stamp of image directory `dir` lives.
pub(crate) fn path_of(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?.to_string_lossy();
    Some(dir.with_file_name(format!(".{name}.verified")))
}

fn identities(layout: &Layout, dir: &Path) -> Option<Vec<Identity>> {
    (layout.names())
        .map(|name| {
            let m = std::fs::metadata(dir.join(name)).ok()?;
            Some(Identity {
                name: name.to_string(),
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
            })
        })
        .collect()
}

/// The digest and chunk table of `dir` as stamped, if its files are still the ones stamped.
pub(crate) fn load(layout: &Layout, dir: &Path) -> Option<(String, Vec<ChunkHash>)> {
    let text = std::fs::read(path_of(dir)?).ok()?;
    let s: Stamp = serde_json::from_slice(&text).ok()?;
    if s.version != VERSION
        || s.chunk != layout.chunk_size()
        || s.table.len() as u64 != layout.count()
    {
        return None;
    }
    if identities(layout, dir)? != s.files {
        return None;
    }
    let table = (s.table.iter())
        .map(|c| match c {
            None => Some(None),
            Some(h) => hex::decode(h).ok()?.try_into().ok().map(Some),
        })
        .collect::<Option<Vec<ChunkHash>>>()?;
    (layout.digest(&table) == s.digest).then_some((s.digest, table))
}

/// When a read that computes a stamp begins: the files must have settled before it.
pub(crate) fn read_start() -> SystemTime {
    SystemTime::now()
}

/// Records what reading `dir` (begun at `began`) found; best effort: an image directory
/// whose parent is not writable simply has no stamp.
pub(crate) fn save(layout: &Layout, dir: &Path, began: SystemTime, table: &[ChunkHash]) {
    let Some(files) = identities(layout, dir) else {
        return;
    };
    let limit = began
        .checked_sub(SETTLED)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    if files.iter().any(|f| f.ctime_ns >= limit) {
        return;
    }
    let Some(path) = path_of(dir) else { return };
    let stamp = Stamp {
        version: VERSION,
        chunk: layout.chunk_size(),
        digest: layout.digest(table),
        table: (table.iter()).map(|c| c.map(hex::encode)).collect(),
        files,
    };
    let Ok(text) = serde_json::to_vec(&stamp) else {
        return;
    };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The chunk table of `dir`: from its stamp when its files are unchanged, else read (and
/// stamped for next time).
pub(crate) fn table(layout: &Layout, dir: &Path) -> Result<Vec<ChunkHash>, super::StageError> {
    if let Some((_, t)) = load(layout, dir) {
        return Ok(t);
    }
    let began = read_start();
    let t = layout.table_of(dir)?;
    save(layout, dir, began, &t);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn image(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir).unwrap();
        let mut f = std::fs::File::create(dir.join("root.ext4")).unwrap();
        f.write_all(&[7u8; 300_000]).unwrap();
        std::fs::write(dir.join("vmlinuz"), b"kernel").unwrap();
        Layout::from_dir(dir, 65536).unwrap()
    }

    /// A settled image is stamped once and then trusted; a write, even of the same size,
    /// voids the stamp; a stamp whose table does not give its digest is ignored.
    #[test]
    fn a_stamp_holds_until_a_file_changes() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("img");
        let layout = image(&dir);
        let table = layout.table_of(&dir).unwrap();
        // Just written: too fresh to stamp.
        save(&layout, &dir, SystemTime::now(), &table);
        assert!(load(&layout, &dir).is_none());
        let later = SystemTime::now() + Duration::from_secs(5);
        save(&layout, &dir, later, &table);
        let (digest, got) = load(&layout, &dir).expect("stamped");
        assert_eq!((digest, got), (layout.digest(&table), table.clone()));
        // Same size, new content: the change time moved.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.join("vmlinuz"), b"KERNEL").unwrap();
        assert!(load(&layout, &dir).is_none());
        // A forged table is not taken.
        let fresh = layout.table_of(&dir).unwrap();
        save(
            &layout,
            &dir,
            SystemTime::now() + Duration::from_secs(5),
            &fresh,
        );
        let p = path_of(&dir).unwrap();
        let mut s: Stamp = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        s.table[0] = Some(hex::encode([0u8; 32]));
        std::fs::write(&p, serde_json::to_vec(&s).unwrap()).unwrap();
        assert!(load(&layout, &dir).is_none());
    }
}
