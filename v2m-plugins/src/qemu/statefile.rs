//! A checkpoint's state stream, written by us rather than by a `cat` QEMU spawns: QEMU gets
//! the write end of a pipe (QMP `getfd`, the descriptor passed with SCM_RIGHTS) and migrates
//! into it; a thread here writes what arrives to the file and hashes it on the way, so the
//! file's SHA-256 is known when QEMU finishes instead of costing another read of it.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

/// Reads of the pipe, and the pipe's buffer: large, so QEMU and the writer switch seldom.
const CHUNK: usize = 1 << 20;

/// The file's size and SHA-256 (hex), once the stream ended.
pub(super) type Written = std::io::Result<(u64, String)>;

/// A pipe whose read end a thread drains into `file`; the write end goes to QEMU.
pub(super) struct StateWriter {
    pub write_end: OwnedFd,
    pub done: JoinHandle<Written>,
}

impl StateWriter {
    pub fn start(file: File) -> std::io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills `fds` with two new descriptors on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned by nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A larger pipe is an optimisation only: a kernel limit leaves the default.
        // SAFETY: F_SETPIPE_SZ on a pipe we own.
        let _ = unsafe {
            libc::fcntl(
                write_end.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                CHUNK as libc::c_int,
            )
        };
        let done = std::thread::spawn(move || drain(File::from(read_end), file));
        Ok(Self { write_end, done })
    }
}

fn drain(mut from: File, mut to: File) -> Written {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..got])?;
        h.update(&buf[..got]);
        n += got as u64;
    }
    to.sync_all()?;
    Ok((n, hex(&h.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends `data` on `sock` with `fd` attached (SCM_RIGHTS), as QMP's `getfd` expects.
pub(super) fn send_with_fd(sock: &UnixStream, data: &[u8], fd: RawFd) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // u64s keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid empty message; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` has a control buffer of CMSG_SPACE(one fd) bytes, so the first header
    // and its data fit in it; `iov` and `control` outlive the sendmsg call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The descriptor went with the first byte; the rest of a short send follows plainly.
    (&*sock).write_all(&data[sent as usize..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_through_the_pipe_lands_in_the_file_with_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let w = StateWriter::start(File::create(&path).unwrap()).unwrap();
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i % 251) as u8).collect();
        let mut pipe = File::from(w.write_end);
        pipe.write_all(&data).unwrap();
        drop(pipe);
        let (n, sum) = w.done.join().unwrap().unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(sum, hex(&Sha256::digest(&data)));
    }

    #[test]
    fn a_descriptor_sent_along_arrives_and_works() {
        let (a, b) = UnixStream::pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("x")).unwrap();
        send_with_fd(&a, b"{\"execute\":\"getfd\"}\n", f.as_raw_fd()).unwrap();
        let mut buf = [0u8; 64];
        let mut control = vec![0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: a zeroed msghdr with our buffers; recvmsg fills them.
        let got = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = 64;
            let n = libc::recvmsg(b.as_raw_fd(), &mut msg, 0);
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            assert!(!cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS);
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
            (n, File::from_raw_fd(fd))
        };
        assert_eq!(&buf[..got.0 as usize], b"{\"execute\":\"getfd\"}\n");
        (&got.1)
            .write_all(b"through the passed descriptor")
            .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("x")).unwrap(),
            b"through the passed descriptor"
        );
    }
}
