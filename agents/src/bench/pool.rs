//! The worker processes of a multi-process bootstrap, seen from the front-end's process: each
//! one started (and set up) before the clock starts, given the spawn orders for the agents of
//! its block, and reaped at the end. A worker dies with this process whatever happens: it is
//! killed when its handle drops, gets SIGKILL if the thread that started it ends
//! (PR_SET_PDEATHSIG), and ends by itself when its stdin closes.

use super::BenchError;
use super::host::LevelJoins;
use super::worker::{Answer, Order, PREFIX, Setup};
use crate::{agent::SpawnedChild, proto::NodeId, secret::JobSecret, sync::lock};
use std::{
    collections::{HashMap, VecDeque},
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

/// How to start a worker: a program whose arguments make it call [`super::worker::serve`]
/// (`vse bench sim-worker`, or a test binary filtered to its worker entry).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// One worker's block: the split-level agents it starts (contiguous ids), and how many agents
/// their subtrees hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub first: u32,
    pub last: u32,
    pub agents: u32,
}

struct Worker {
    block: Block,
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Reaps the process (killing it if it still runs) and reads the rest of its stderr.
    fn end(&mut self) -> Option<std::process::ExitStatus> {
        self.stdin.take();
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let status = self.child.wait().ok();
        if let Some(t) = self.stderr_reader.take() {
            let _ = t.join();
        }
        status
    }
}

#[derive(Default)]
struct Shared {
    /// A root's exit, by its id, for the front-end side's `SpawnedChild`.
    exits: Mutex<HashMap<NodeId, oneshot::Sender<String>>>,
    reports: Mutex<HashMap<usize, (Vec<LevelJoins>, u32)>>,
}

/// The running workers.
pub struct Pool {
    blocks: Vec<Block>,
    workers: Vec<Mutex<Worker>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} workers)", self.workers.len())
    }
}

impl Pool {
    /// Starts one worker per block and waits until every one is set up (`ready`). Must be
    /// called from a thread that outlives the pool (the death signal follows that thread).
    pub fn start(
        cmd: &WorkerCommand,
        blocks: Vec<Block>,
        secret: &JobSecret,
        setup: &Setup,
    ) -> Result<Self, BenchError> {
        let shared = Arc::new(Shared::default());
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<u64, String>)>();
        let mut pool = Pool {
            blocks: blocks.clone(),
            workers: Vec::new(),
            shared: shared.clone(),
        };
        let n = blocks.len();
        for (i, block) in blocks.into_iter().enumerate() {
            let w = start_one(
                cmd,
                i,
                block,
                secret,
                setup,
                shared.clone(),
                ready_tx.clone(),
            )?;
            pool.workers.push(Mutex::new(w));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            match ready_rx.recv_timeout(left) {
                Ok((i, Ok(fds))) if fds < setup.fds => {
                    return Err(pool.failed(i, &format!("only {fds} descriptors available")));
                }
                Ok((_, Ok(_))) => {}
                Ok((i, Err(e))) => return Err(pool.failed(i, &e)),
                Err(_) => return Err(BenchError::Run("workers not ready within 60 s".into())),
            }
        }
        Ok(pool)
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    fn owner(&self, id: NodeId) -> Option<usize> {
        let i = self.blocks.partition_point(|b| b.last < id.0);
        self.blocks
            .get(i)
            .filter(|b| (b.first..=b.last).contains(&id.0))
            .map(|_| i)
    }

    fn order(&self, w: usize, o: &Order) -> bool {
        let line = serde_json::to_string(o).expect("orders serialise");
        let mut w = lock(&self.workers[w]);
        w.stdin
            .as_mut()
            .is_some_and(|s| writeln!(s, "{line}").and_then(|()| s.flush()).is_ok())
    }

    /// Has the worker of block `id` start agent `id`; the handle resolves when it ends, and
    /// kills it (through its worker) when dropped.
    pub fn spawn(self: &Arc<Self>, id: NodeId, parent: SocketAddr) -> SpawnedChild {
        let (exit_tx, exit_rx) = oneshot::channel();
        let owner = self.owner(id);
        let sent = owner.is_some_and(|w| {
            lock(&self.shared.exits).insert(id, exit_tx);
            self.order(w, &Order::Spawn { id: id.0, parent })
        });
        let pool = self.clone();
        SpawnedChild::new(id, move |kill| async move {
            if !sent {
                lock(&pool.shared.exits).remove(&id);
                return format!("no worker could start {id}");
            }
            let w = owner.expect("sent to an owner");
            tokio::pin!(exit_rx);
            tokio::select! {
                how = &mut exit_rx => how.unwrap_or_else(|_| "worker process ended".into()),
                _ = kill => {
                    pool.order(w, &Order::Kill { id: id.0 });
                    let _ = tokio::time::timeout(Duration::from_secs(5), exit_rx).await;
                    "killed".into()
                }
            }
        })
    }

    /// Closes every worker's stdin, collects its report and reaps it. An error names the first
    /// worker that did not end well (its status and the last lines of its stderr).
    pub fn finish(&self) -> Result<Vec<(Block, Vec<LevelJoins>)>, BenchError> {
        for w in &self.workers {
            lock(w).stdin.take();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        let mut first_err = None;
        for (i, w) in self.workers.iter().enumerate() {
            let mut w = lock(w);
            let status = wait_until(&mut w.child, deadline);
            if let Some(r) = w.reader.take() {
                let _ = r.join();
            }
            let _ = w.end();
            let report = lock(&self.shared.reports).remove(&i);
            let problem = match (&status, &report) {
                (Some(s), Some((_, 0))) if s.success() => None,
                (Some(s), Some((_, left))) if s.success() => {
                    Some(format!("{left} agent(s) still running at its end"))
                }
                (Some(s), _) if s.success() => Some("exited without a report".into()),
                (Some(s), _) => Some(format!("exited with {s}")),
                (None, _) => Some("did not exit within 30 s (killed)".into()),
            };
            match problem {
                None => out.push((w.block.clone(), report.expect("checked").0)),
                Some(p) if first_err.is_none() => first_err = Some(describe(i, &w, &p)),
                Some(_) => {}
            }
        }
        match first_err {
            Some(e) => Err(BenchError::Run(e)),
            None => Ok(out),
        }
    }

    /// Process ids of the workers (to check that none is left).
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| lock(w).child.id()).collect()
    }

    fn failed(&self, i: usize, why: &str) -> BenchError {
        let mut w = lock(&self.workers[i]);
        let why = match w.end() {
            Some(s) => format!("{why} ({s})"),
            None => why.to_string(),
        };
        BenchError::Run(describe(i, &w, &why))
    }
}

fn describe(i: usize, w: &Worker, why: &str) -> String {
    let tail: Vec<String> = lock(&w.stderr).iter().cloned().collect();
    format!(
        "bootstrap worker {i} (agents {}..={} and their subtrees, pid {}): {why}{}",
        w.block.first,
        w.block.last,
        w.child.id(),
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends with: {}", tail.join(" | "))
        }
    )
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

fn start_one(
    cmd: &WorkerCommand,
    i: usize,
    block: Block,
    secret: &JobSecret,
    setup: &Setup,
    shared: Arc<Shared>,
    ready: mpsc::Sender<(usize, Result<u64, String>)>,
) -> Result<Worker, BenchError> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().map_err(|e| {
        BenchError::Run(format!(
            "cannot start bootstrap worker `{}`: {e}",
            cmd.program.display()
        ))
    })?;
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let stderr_pipe = child.stderr.take().expect("piped");
    let stderr = Arc::new(Mutex::new(VecDeque::new()));
    let tail = stderr.clone();
    let stderr_reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
            let mut t = lock(&tail);
            if t.len() == 8 {
                t.pop_front();
            }
            t.push_back(line);
        }
    });
    let range = block.first..=block.last;
    let reader = std::thread::spawn(move || read_answers(i, range, stdout, &shared, &ready));
    let setup_lines = format!(
        "{}\n{}\n",
        secret.to_hex(),
        serde_json::to_string(setup).expect("setup serialises")
    );
    if let Some(s) = stdin.as_mut() {
        // A worker that died at once shows up as not ready, with its stderr.
        let _ = s.write_all(setup_lines.as_bytes()).and_then(|()| s.flush());
    }
    Ok(Worker {
        block,
        child,
        stdin,
        stderr,
        stderr_reader: Some(stderr_reader),
        reader: Some(reader),
    })
}

fn read_answers(
    i: usize,
    block: std::ops::RangeInclusive<u32>,
    stdout: std::process::ChildStdout,
    shared: &Shared,
    ready: &mpsc::Sender<(usize, Result<u64, String>)>,
) {
    let mut was_ready = false;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        // Wherever it starts: a harness may have left a line unfinished before it.
        let Some(json) = line.find(PREFIX).map(|at| &line[at + PREFIX.len()..]) else {
            continue;
        };
        match serde_json::from_str::<Answer>(json) {
            Ok(Answer::Ready { fds }) => {
                was_ready = true;
                let _ = ready.send((i, Ok(fds)));
            }
            Ok(Answer::Exit { id, how }) => {
                if let Some(tx) = lock(&shared.exits).remove(&NodeId(id)) {
                    let _ = tx.send(how);
                }
            }
            Ok(Answer::Report {
                levels,
                still_running,
            }) => {
                lock(&shared.reports).insert(i, (levels, still_running));
            }
            Err(e) => {
                let _ = ready.send((i, Err(format!("bad answer `{json}`: {e}"))));
            }
        }
    }
    if !was_ready {
        let _ = ready.send((i, Err("ended before it was ready".into())));
    }
    // Its agents are gone with it: the handles of its roots still waiting learn so (their exit
    // channels close when dropped here).
    lock(&shared.exits).retain(|id, _| !block.contains(&id.0));
}
