//! The pluggable hook: an external command that receives samples as JSON lines on stdin.

use super::{MonitorError, Sample, json_line};
use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A running hook command. Dropping it closes its stdin, gives it a moment to flush, and
/// kills it if it lingers, so no hook process outlives the sampler.
pub struct CommandHook {
    command: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl CommandHook {
    pub fn spawn(program: &str, args: &[String]) -> Result<Self, MonitorError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| MonitorError::Hook {
                command: program.to_string(),
                reason: format!("cannot start: {e}; hint: give an absolute path or one on PATH"),
            })?;
        let stdin = child.stdin.take();
        Ok(Self {
            command: program.to_string(),
            child,
            stdin,
        })
    }

    /// Sends a batch; an exited hook is reported with its exit status.
    pub fn send(&mut self, samples: &[Sample]) -> Result<(), MonitorError> {
        let buf: String = samples.iter().map(json_line).collect();
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(self.dead("stdin already closed".into()));
        };
        if let Err(e) = stdin.write_all(buf.as_bytes()).and_then(|_| stdin.flush()) {
            self.stdin = None;
            let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(self.dead(format!("write failed ({e}); hook exited: {status}")));
        }
        Ok(())
    }

    fn dead(&self, reason: String) -> MonitorError {
        MonitorError::Hook {
            command: self.command.clone(),
            reason,
        }
    }

    /// Closes stdin and waits up to `grace` for the hook to exit; kills it otherwise.
    pub fn finish(mut self, grace: Duration) -> Result<std::process::ExitStatus, MonitorError> {
        self.close(grace)
    }

    fn close(&mut self, grace: Duration) -> Result<std::process::ExitStatus, MonitorError> {
        self.stdin = None;
        let until = Instant::now() + grace;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                return Ok(self.child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for CommandHook {
    fn drop(&mut self) {
        let _ = self.close(Duration::from_secs(2));
    }
}
