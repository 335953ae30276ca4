//! The job's private VM network: every VM of a job gets a virtio-net NIC whose frames travel
//! as UDP datagrams (QEMU `-netdev dgram`, on loopback) to a relay in its node agent, which
//! seals them with the job's network key for a small L2 switch run by the front-end on the
//! allocation network. All VMs of a job, on any node, share that one L2 segment and nothing
//! else: the switch forwards only between the endpoints registered for this job.

mod plan;
mod relay;
mod seal;
mod switch;

pub use plan::{JobNet, NetError, RankNet, guest_key};
pub use relay::{Relay, RelayStats};
pub use seal::NetKey;
pub use switch::{Switch, SwitchStats};

/// Wakes a thread blocked receiving on `sock` (it returns at once, with nothing, from then
/// on), so a stopping relay or switch ends now rather than at its next read timeout: that
/// timeout was paid at every rank's end and the job's.
fn wake(sock: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd;
    // SAFETY: `sock` owns the descriptor for the duration of the call; shutdown(2) neither
    // closes it nor touches memory. On a socket that is not connected it also returns
    // ENOTCONN, after waking its readers, which is all that is wanted here.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
}
