//! The NIC's host end, opened by us and handed to QEMU as a descriptor, so QEMU never opens a
//! network endpoint itself (its sandbox forbids spawning the bridge helper) and so a UDP
//! endpoint is `connect()`ed: QEMU's own `-netdev dgram` socket takes a datagram from any
//! local process, a connected one only from its peer (the kernel drops the rest).

use crate::profile::{NetMode, Network};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where the descriptor sits in QEMU's process (its argv names this number).
pub const NET_FD: RawFd = 3;

/// Debian's (and upstream's default) setuid helper that opens a tap on a bridge.
const BRIDGE_HELPER: &str = "/usr/lib/qemu/qemu-bridge-helper";

/// The descriptor the NIC's netdev uses, or None for modes QEMU handles without one.
pub fn open(net: &Network) -> io::Result<Option<OwnedFd>> {
    match net.mode {
        NetMode::None | NetMode::User => Ok(None),
        NetMode::Udp => match (net.local, net.remote) {
            (Some(l), Some(r)) => udp_connected(l, r).map(|s| Some(s.into())),
            _ => Err(io::Error::other("udp mode without local and remote")),
        },
        NetMode::Bridge => bridge_tap(net.bridge.as_deref().unwrap_or("")).map(Some),
    }
}

/// A UDP socket bound to `local` that only exchanges datagrams with `remote`.
pub fn udp_connected(local: SocketAddr, remote: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(local)?;
    s.connect(remote)?;
    Ok(s)
}

/// Runs the bridge helper the way QEMU would (`--use-vnet --br=BR --fd=N`) and receives the
/// tap descriptor it sends back over a socket pair.
fn bridge_tap(bridge: &str) -> io::Result<OwnedFd> {
    if !Path::new(BRIDGE_HELPER).exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{BRIDGE_HELPER} is missing (apt-get install qemu-system-common)"),
        ));
    }
    let (ours, theirs) = UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(BRIDGE_HELPER);
    cmd.arg("--use-vnet")
        .arg(format!("--br={bridge}"))
        .arg(format!("--fd={NET_FD}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe; `fd` stays open in the parent until the
    // child has been spawned.
    unsafe {
        cmd.pre_exec(move || pass_as(fd, NET_FD));
    }
    let out = cmd.output()?;
    drop(theirs);
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{BRIDGE_HELPER} --br={bridge} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    recv_fd(&ours)
}

/// In a child before exec: `fd` becomes `target`, inherited across exec.
pub(super) fn pass_as(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: plain descriptor calls on numbers the caller owns in this (forked) process.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One descriptor sent with SCM_RIGHTS on `sock`.
fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid empty message; its buffers are set below and
    // outlive the call; the control data is read only when the kernel put a header there.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        if libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::other("the bridge helper sent no descriptor"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connected_endpoint_takes_datagrams_from_its_peer_only() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let vm = udp_connected("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        let at = vm.local_addr().unwrap();
        stranger.send_to(b"forged", at).unwrap();
        peer.send_to(b"frame", at).unwrap();
        let mut buf = [0u8; 16];
        let n = vm.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"frame", "the stranger's datagram arrived first");
        vm.set_nonblocking(true).unwrap();
        assert!(vm.recv(&mut buf).is_err(), "a second datagram arrived");
    }
}
