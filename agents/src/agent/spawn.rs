//! Starting child agents: in this process (simulation, benchmarks), or as `vse agent` processes
//! started directly, with `srun`, with `ssh`, or through a wrapper such as `ip netns exec NS`.
//! A [`SpawnedChild`] kills its agent when dropped, and reports its exit (the SIGCHLD detector).

use super::AgentConfig;
use crate::proto::NodeId;
use std::{future::Future, net::SocketAddr, path::PathBuf, process::Stdio, sync::Arc};
use thiserror::Error;
use tokio::{io::AsyncWriteExt, sync::oneshot, task::JoinHandle};

#[derive(Debug, Error)]
pub enum SpawnError {
    #[error("cannot start `{program}` for {id}: {source}")]
    Exec {
        id: NodeId,
        program: String,
        source: std::io::Error,
    },
    #[error("cannot hand {id} the job secret: {source}")]
    Secret {
        id: NodeId,
        source: crate::secret::SecretError,
    },
}

/// What a parent tells the spawner about the child it wants.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub id: NodeId,
    pub parent: SocketAddr,
    /// Configuration the child will run with (its own id, the same tree, hosts, timing).
    pub config: AgentConfig,
}

pub trait Spawner: Send + Sync + std::fmt::Debug {
    fn spawn(&self, spec: ChildSpec) -> Result<SpawnedChild, SpawnError>;

    /// Command-line words that make a `vse agent` child build the same spawner for its children.
    fn child_args(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A started child. Dropping it kills the child; the exit receiver resolves when it ends.
pub struct SpawnedChild {
    pub id: NodeId,
    kill: Option<oneshot::Sender<()>>,
    done: JoinHandle<()>,
    exit: Option<oneshot::Receiver<String>>,
}

impl SpawnedChild {
    /// Wraps a running child: `body` gets a receiver that fires (or closes) when the child must
    /// be killed, and returns how the child ended.
    pub fn new<F>(id: NodeId, body: impl FnOnce(oneshot::Receiver<()>) -> F) -> Self
    where
        F: Future<Output = String> + Send + 'static,
    {
        let (kill, rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let fut = body(rx);
        let done = tokio::spawn(async move {
            let _ = exit_tx.send(fut.await);
        });
        Self {
            id,
            kill: Some(kill),
            done,
            exit: Some(exit_rx),
        }
    }

    /// How the child ended, once it has (the SIGCHLD detector). Can be taken once.
    pub fn take_exit(&mut self) -> Option<oneshot::Receiver<String>> {
        self.exit.take()
    }

    /// Waits up to `grace` for the child to end by itself, then kills it; returns when reaped.
    pub async fn finish(mut self, grace: std::time::Duration) {
        if tokio::time::timeout(grace, &mut self.done).await.is_err() {
            if let Some(k) = self.kill.take() {
                let _ = k.send(());
            }
            let _ = (&mut self.done).await;
        }
    }

    /// Kills the child and waits until it is gone (reaped).
    pub async fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        let _ = (&mut self.done).await;
    }
}

impl Drop for SpawnedChild {
    fn drop(&mut self) {
        // The watcher sees the closed channel and kills; it keeps running to reap the process.
        self.kill.take();
    }
}

/// How a child agent process is started on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    Direct,
    Srun,
    Ssh,
    /// A command prefix with `{host}` replaced by the node's host name (`ip netns exec {host}`).
    Wrapper(Vec<String>),
}

/// Starts `EXE agent …` processes. The job secret goes to the child on its stdin, never in its
/// argv or environment (visible to other users in /proc).
#[derive(Debug, Clone)]
pub struct ProcessSpawner {
    pub exe: PathBuf,
    pub remote: Remote,
}

impl ProcessSpawner {
    pub fn argv(&self, spec: &ChildSpec) -> Vec<String> {
        let host = spec
            .config
            .host_of(spec.id)
            .unwrap_or_else(|| "localhost".into());
        let mut argv: Vec<String> = match &self.remote {
            Remote::Direct => vec![],
            Remote::Srun => [
                "srun",
                "--overlap",
                "--nodes=1",
                "--ntasks=1",
                "--input=all",
                "-w",
                &host,
            ]
            .map(String::from)
            .to_vec(),
            Remote::Ssh => ["ssh", "-o", "BatchMode=yes", &host]
                .map(String::from)
                .to_vec(),
            Remote::Wrapper(words) => words.iter().map(|w| w.replace("{host}", &host)).collect(),
        };
        argv.push(self.exe.display().to_string());
        argv.extend(spec.config.to_args(spec.id, spec.parent));
        argv
    }
}

impl Spawner for ProcessSpawner {
    fn child_args(&self) -> Vec<String> {
        let remote = match &self.remote {
            Remote::Direct => "direct".to_string(),
            Remote::Srun => "srun".to_string(),
            Remote::Ssh => "ssh".to_string(),
            Remote::Wrapper(w) => format!("wrap:{}", w.join(" ")),
        };
        vec!["--remote".into(), remote]
    }

    fn spawn(&self, spec: ChildSpec) -> Result<SpawnedChild, SpawnError> {
        let argv = self.argv(&spec);
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::piped())
            .kill_on_drop(true);
        let err = |source| SpawnError::Exec {
            id: spec.id,
            program: argv[0].clone(),
            source,
        };
        // srun forwards the child's stdin to its node unencrypted; ssh encrypts it, and the
        // other ways stay on this machine.
        let sealed = matches!(self.remote, Remote::Srun);
        let secret =
            (spec.config.secret.to_transport(sealed)).map_err(|source| SpawnError::Secret {
                id: spec.id,
                source,
            })?;
        let mut child = cmd.spawn().map_err(err)?;
        let mut stdin = child.stdin.take();
        let id = spec.id;
        Ok(SpawnedChild::new(id, move |kill| async move {
            if let Some(s) = stdin.as_mut() {
                let _ = s.write_all(secret.as_bytes()).await;
            }
            drop(stdin);
            tokio::select! {
                st = child.wait() => match st {
                    Ok(st) => format!("process exited: {st}"),
                    Err(e) => format!("process lost: {e}"),
                },
                _ = kill => {
                    let _ = child.kill().await;
                    "killed".to_string()
                }
            }
        }))
    }
}

pub type SharedSpawner = Arc<dyn Spawner>;

/// A `--remote` value that names no way of starting agents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown remote `{0}`: expected direct, srun, ssh or wrap:CMD")]
pub struct UnknownRemote(pub String);

impl vse_exit::Classify for UnknownRemote {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

impl std::str::FromStr for Remote {
    type Err = UnknownRemote;
    fn from_str(s: &str) -> Result<Self, UnknownRemote> {
        match s {
            "direct" => Ok(Self::Direct),
            "srun" => Ok(Self::Srun),
            "ssh" => Ok(Self::Ssh),
            _ => match s.strip_prefix("wrap:") {
                Some(w) if !w.trim().is_empty() => Ok(Self::Wrapper(
                    w.split_whitespace().map(String::from).collect(),
                )),
                _ => Err(UnknownRemote(s.to_string())),
            },
        }
    }
}
