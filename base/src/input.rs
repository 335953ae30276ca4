//! Reading a file a user named (a spec, a policy, a lock, a signature): at most a bounded
//! number of bytes, and only from a regular file. A FIFO would block the open and the read
//! forever, a device (`/dev/zero`) never ends, a directory is no input: each is refused with
//! an error the caller's message names.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The first `limit + 1` bytes of the regular file `path` (one past the limit, so the caller
/// can tell a file that is too large). Opened without blocking and without becoming anyone's
/// terminal; anything but a regular file is `InvalidInput`.
pub fn read_input(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, device or socket)"
        };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, what));
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether an I/O error reading a path the user gave is the user's to fix (no such file, not
/// a file, a symlink loop, no permission), as opposed to the host failing.
pub fn is_users_path_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::InvalidInput
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::IsADirectory
            | io::ErrorKind::NotADirectory
    ) || matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENAMETOOLONG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read_and_only_up_to_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_input(&f, 4).unwrap(), b"01234");
        assert_eq!(read_input(&f, 100).unwrap(), b"0123456789");
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let loop_ = d.path().join("loop");
        std::os::unix::fs::symlink("loop", &loop_).unwrap();
        for bad in [fifo.as_path(), d.path(), Path::new("/dev/zero"), &loop_] {
            let e = read_input(bad, 4).unwrap_err();
            assert!(is_users_path_error(&e), "{}: {e}", bad.display());
        }
    }
}
