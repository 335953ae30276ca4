//! `vse launch`'s standard input, forwarded to rank 0's command (as `srun` forwards its own to
//! task 0): chunks numbered by their offset in the input go to whichever node holds rank 0's
//! VM now, and each waits for the node's word that the guest wrote it. A chunk that gets no
//! answer (the VM was moving, its node was still booting it) goes again, to the VM's node of
//! then; the guest writes each byte once, whatever it is sent twice.

use super::relay::Owners;
use crate::sync::lock;
use crate::wire::{LaunchMsg, Wire};
use agents::agent::{Control, JobHandle};
use std::io::Read;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;
use vse_guest_agent::protocol::{hex, read_chunk};

/// Bytes of input per chunk (twice that as hex on the overlay).
const CHUNK: usize = 32 * 1024;
/// How long a chunk first waits for its acknowledgement before it goes again; each wait on
/// the same node doubles, up to [`RESEND_MAX`] (a command that does not read for hours costs
/// a message a minute), and a move of the VM sends it at once.
const RESEND: Duration = Duration::from_secs(2);
const RESEND_MAX: Duration = Duration::from_secs(60);

/// Forwards `input` to the command of VM `vm` on a thread of its own; the returned sender
/// takes the acknowledgements (`LaunchMsg::StdinTaken`: input written up to an offset).
pub fn forward(
    input: impl Read + Send + 'static,
    vm: String,
    owners: Owners,
    h: JobHandle<Wire>,
) -> Sender<u64> {
    let (tx, rx) = channel();
    std::thread::spawn(move || pump(input, &vm, &owners, &h, &rx));
    tx
}

fn pump(
    mut input: impl Read,
    vm: &str,
    owners: &Owners,
    h: &JobHandle<Wire>,
    acks: &Receiver<u64>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = read_chunk(&mut input, &mut buf);
        let data = hex(&buf[..n]);
        let upto = offset + n as u64;
        let mut last: Option<(agents::proto::NodeId, Duration)> = None;
        loop {
            let Some(dst) = lock(owners).get(vm).copied() else {
                return;
            };
            let patience = match last {
                Some((node, p)) if node == dst => (p * 2).min(RESEND_MAX),
                _ => RESEND,
            };
            last = Some((dst, patience));
            let msg = Wire::Launch(LaunchMsg::Stdin {
                vm: vm.to_string(),
                offset,
                data: data.clone(),
                eof: n == 0,
            });
            h.control(Control::Send { dst, msg });
            let moved = || lock(owners).get(vm).copied() != Some(dst);
            match wait(acks, upto, patience, moved) {
                Taken::Upto => break,
                Taken::Not => continue,
                // The command reads no more, or the job is over: the rest is not sent.
                Taken::NoMore => return,
            }
        }
        if n == 0 {
            return;
        }
        offset = upto;
    }
}

/// What became of a chunk.
enum Taken {
    /// The guest has the input up to the chunk's end.
    Upto,
    /// No word in time: send it again.
    Not,
    /// The command reads no more input (`u64::MAX`), or the front-end is gone.
    NoMore,
}

/// Waits up to `patience` (less once `moved` says the VM changed node) for the chunk ending
/// at `upto`.
fn wait(acks: &Receiver<u64>, upto: u64, patience: Duration, moved: impl Fn() -> bool) -> Taken {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let now = std::time::Instant::now();
        if now >= deadline || moved() {
            return Taken::Not;
        }
        let left = (deadline - now).min(Duration::from_secs(1));
        match acks.recv_timeout(left) {
            Ok(u64::MAX) | Err(RecvTimeoutError::Disconnected) => return Taken::NoMore,
            Ok(got) if got >= upto => return Taken::Upto,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
        }
    }
}
