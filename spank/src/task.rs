//! `vse spank task -- CMD…`: what a Slurm task becomes (the shim execs it from
//! `slurm_spank_task_init`, as the job user, with the task's environment). It hands CMD, the
//! environment (rank variables included) and the working directory to the node's VM
//! service, prints the output as the guest writes it and returns CMD's status.

use crate::proto::{self, ExecRequest, MAX_REQUEST, Reply, SOCKET};
use crate::{SpankError, TaskArgs};
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use vse_guest_agent::protocol::OutStream;

/// The service is forked just before the tasks; it binds its socket first thing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

fn connect(sock: &Path) -> Result<UnixStream, SpankError> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => {
                return Err(SpankError::Node(format!(
                    "the node's vse service did not answer at {} within {CONNECT_TIMEOUT:?}: \
                     {e}",
                    sock.display()
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Runs the task's command in the node's VM; returns its exit status (128 + signal for a
/// command a signal ended, as a shell reports it).
pub fn run(a: TaskArgs) -> Result<u8, SpankError> {
    let conn = connect(&a.dir.join(SOCKET))?;
    let env = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "/".into());
    let node = std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| "this node".into());
    proto::send(
        &conn,
        &ExecRequest {
            argv: a.argv,
            env,
            cwd,
        },
    )
    .map_err(SpankError::io(
        "sending the command to the node's vse service",
    ))?;
    // The task's standard input (what srun forwards) follows the request on the connection;
    // its end is the command's end of input.
    let mut to_node = conn
        .try_clone()
        .map_err(SpankError::io("the connection to the node's vse service"))?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_node);
        let _ = to_node.shutdown(std::net::Shutdown::Write);
    });
    let mut r = BufReader::new(&conn);
    loop {
        let reply: Option<Reply> = proto::recv(&mut r, MAX_REQUEST)
            .map_err(SpankError::io("reading from the node's vse service"))?;
        match reply {
            Some(Reply::Output { stream, data }) => {
                let _ = match stream {
                    OutStream::Stdout => {
                        let mut o = std::io::stdout().lock();
                        o.write_all(data.as_bytes()).and_then(|_| o.flush())
                    }
                    OutStream::Stderr => std::io::stderr().write_all(data.as_bytes()),
                };
            }
            Some(Reply::Exited { status }) => return Ok(u8::try_from(status).unwrap_or(1)),
            Some(Reply::Failed { message, invalid }) => {
                let msg = format!("VM on {node}: {message}");
                return Err(if invalid {
                    SpankError::Invalid(msg)
                } else {
                    SpankError::Node(msg)
                });
            }
            None => {
                return Err(SpankError::Node(format!(
                    "VM on {node}: the vse service ended before the command did"
                )));
            }
        }
    }
}
