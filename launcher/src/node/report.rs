//! What a node tells the front-end about its ranks while they run: their output chunk by
//! chunk, their status at the end, and their barrier lines.

use super::NodeError;
use super::service::Node;
use super::state::Rank;
use crate::wire::{BarrierMsg, LaunchMsg, RankTimes, Stream, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use vse_guest_agent::protocol::OutStream;
use vse_guest_agent::{BarrierRelay, ExecOutput, PendingExec};

fn to_front(h: &JobHandle<Wire>, msg: Wire) {
    h.control(Control::Send {
        dst: NodeId(0),
        msg,
    });
}

/// Waits for the rank's command while watching its VM. `Ok(None)`: the VM migrated away and
/// the destination node reports the rank.
pub(crate) fn await_rank(
    pending: &PendingExec,
    pid: u32,
    handed_off: &AtomicBool,
    on_output: &mut dyn FnMut(OutStream, &str),
) -> Result<Option<ExecOutput>, NodeError> {
    loop {
        if handed_off.load(Ordering::SeqCst) {
            // Output the guest wrote before it paused still sits here: pass it on, the rest
            // comes through the destination.
            let _ = pending.poll(Duration::ZERO, on_output);
            return Ok(None);
        }
        match pending.poll(Duration::from_millis(500), on_output)? {
            Some(out) => return Ok(Some(out)),
            // During a hand-over the source QEMU exits before the flag is set: look again.
            None if !vmhost::alive(pid) && !handed_off.load(Ordering::SeqCst) => {
                std::thread::sleep(Duration::from_millis(500));
                if !handed_off.load(Ordering::SeqCst) {
                    return Err(NodeError::HypervisorExited(pid));
                }
            }
            None => {}
        }
    }
}

/// Forwards a rank's output to the front-end chunk by chunk, while the rank runs, noting
/// when in `seen`.
pub(crate) fn rank_output<'a>(
    h: &'a JobHandle<Wire>,
    rank: u32,
    seen: &'a Mutex<Instant>,
) -> impl Fn(OutStream, &str) + 'a {
    move |stream, data| {
        *crate::sync::lock(seen) = Instant::now();
        let stream = match stream {
            OutStream::Stdout => Stream::Stdout,
            OutStream::Stderr => Stream::Stderr,
        };
        let data = data.to_string();
        to_front(
            h,
            Wire::Launch(LaunchMsg::RankOutput { rank, stream, data }),
        );
    }
}

/// Sends a rank's output and status (or why it has none) to the front-end.
pub(crate) fn report_rank(
    node: &Node,
    rank: u32,
    out: Result<ExecOutput, NodeError>,
    times: Option<RankTimes>,
) {
    let h = &node.h;
    match out {
        Ok(out) => {
            for (stream, data) in [(Stream::Stdout, out.stdout), (Stream::Stderr, out.stderr)] {
                if !data.is_empty() {
                    to_front(
                        h,
                        Wire::Launch(LaunchMsg::RankOutput { rank, stream, data }),
                    );
                }
            }
            let exited = LaunchMsg::RankExited {
                rank,
                code: out.status,
                error: None,
                times,
            };
            node.tell(Wire::Launch(exited));
        }
        Err(e) => {
            let exited = LaunchMsg::RankExited {
                rank,
                code: -1,
                error: Some(e.describe()),
                times,
            };
            node.tell(Wire::Launch(exited));
        }
    }
}

/// Barrier lines of a VM's guest ranks, up the overlay to the front-end's controller.
pub(crate) struct NodeRelay {
    pub vm: String,
    pub h: JobHandle<Wire>,
}

impl BarrierRelay for NodeRelay {
    fn up(&self, conn: u64, line: &str) {
        let up = BarrierMsg::Up {
            vm: self.vm.clone(),
            conn,
            line: line.to_string(),
        };
        to_front(&self.h, Wire::Barrier(up));
    }

    fn closed(&self, conn: u64) {
        let vm = self.vm.clone();
        to_front(&self.h, Wire::Barrier(BarrierMsg::UpClosed { vm, conn }));
    }
}

/// Chunks of standard input on their way to a guest, by link and offset.
static IN_FLIGHT: Mutex<std::collections::BTreeSet<(usize, u64)>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Hands a chunk of the front-end's standard input to `rank`'s command and tells the
/// front-end how far the guest has it (`u64::MAX`: the command reads no more); a chunk that
/// does not reach the guest gets no answer, and the front-end sends it again.
pub(crate) fn forward_stdin(
    h: &JobHandle<Wire>,
    rank: &Rank,
    (offset, data, eof): (u64, String, bool),
) {
    let Some(bytes) = vse_guest_agent::protocol::unhex(&data) else {
        return;
    };
    let upto = offset + bytes.len() as u64;
    // The front-end sends a chunk again while its first send still waits for a command that
    // does not read: one of them goes to the guest at a time.
    let key = (std::sync::Arc::as_ptr(&rank.link) as usize, offset);
    if !crate::sync::lock(&IN_FLIGHT).insert(key) {
        return;
    }
    let sent = rank.link.send_stdin(rank.exec_id, offset, &bytes, eof);
    crate::sync::lock(&IN_FLIGHT).remove(&key);
    let upto = match sent {
        Ok(()) => upto,
        // The guest answered: the command closed its input, ended, or never had one.
        Err(vse_guest_agent::LinkError::Agent(_)) => u64::MAX,
        Err(_) => return,
    };
    to_front(
        h,
        Wire::Launch(LaunchMsg::StdinTaken {
            rank: rank.rank,
            upto,
        }),
    );
}
