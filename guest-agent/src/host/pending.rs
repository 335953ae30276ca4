//! A command started in the guest whose reply has not come yet.

use super::{ExecOutput, LinkError};
use crate::protocol::{Message, OutStream};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub struct PendingExec {
    pub(super) id: u64,
    pub(super) rx: Receiver<Message>,
}

/// The final reply of a command, or why there is none.
pub(super) fn exited(m: Message) -> Result<ExecOutput, LinkError> {
    match m {
        Message::Exited {
            status,
            stdout,
            stderr,
            ..
        } => Ok(ExecOutput {
            status,
            stdout,
            stderr,
        }),
        Message::Error { message, .. } => Err(LinkError::Agent(message)),
        other => Err(LinkError::Agent(format!("unexpected reply {other:?}"))),
    }
}

impl PendingExec {
    /// The request id the guest agent will answer (stable across a migration of the VM).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits up to `timeout`: `None` while the command still runs, so a caller can watch the
    /// VM meanwhile (a dead VM never answers). A streamed command's chunks that arrive
    /// meanwhile go to `on_output` in order (its final result then carries no output).
    pub fn poll(
        &self,
        timeout: Duration,
        on_output: &mut dyn FnMut(OutStream, &str),
    ) -> Result<Option<ExecOutput>, LinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Message::Output { stream, data, .. }) => on_output(stream, &data),
                Ok(m) => return exited(m).map(Some),
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(LinkError::Agent("the guest agent link was closed".into()));
                }
            }
        }
    }

    /// Waits up to `timeout` for the whole output (of a command started without streaming).
    pub fn wait(self, timeout: Duration) -> Result<ExecOutput, LinkError> {
        match self.rx.recv_timeout(timeout) {
            Ok(m) => exited(m),
            Err(_) => Err(LinkError::Timeout {
                id: self.id,
                waited: timeout,
            }),
        }
    }
}
