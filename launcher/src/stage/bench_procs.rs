//! The staging benchmark with every node a process of its own (`vse bench stage-node`,
//! hidden), as node agents are on a cluster and as `sbcast` has a `slurmd` per node: the same
//! staging code as [`super::bench::stage_dir`], which runs every node's server in the
//! benchmark's own process. The two rows side by side show what the process structure costs.
//!
//! A node process reads one line on its standard input (`ID CACHE SECRET WINDOW LEVEL`: the
//! job secret never goes on a command line), prints the address it listens on, serves until
//! its standard input closes, and exits.

use super::bench::{DirStaging, summarize};
use crate::stage::{StageOptions, StageServer, stage_image};
use agents::{
    bench::{BenchError, WorkerCommand, runtime},
    proto::NodeId,
    secret::JobSecret,
};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// A node process, killed if the benchmark ends before it closed its input.
struct NodeProc {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn spawn(
    cmd: &WorkerCommand,
    id: u32,
    cache: &Path,
    key: &JobSecret,
    opts: StageOptions,
) -> Result<(NodeProc, std::net::SocketAddr), BenchError> {
    let err = |what: &str| BenchError::Run(format!("stage node {id}: {what}"));
    let mut child = Command::new(&cmd.program)
        .args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| err(&format!("{}: {e}", cmd.program.display())))?;
    let mut stdin = child.stdin.take().ok_or_else(|| err("no stdin"))?;
    writeln!(
        stdin,
        "{id} {} {} {} {}",
        cache.display(),
        key.to_hex(),
        opts.window,
        opts.compress.unwrap_or(0)
    )
    .map_err(|e| err(&e.to_string()))?;
    let mut line = String::new();
    let out = child.stdout.take().ok_or_else(|| err("no stdout"))?;
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| err(&e.to_string()))?;
    let addr = line
        .trim()
        .parse()
        .map_err(|_| err(&format!("said {line:?}, not its address")))?;
    let proc_ = NodeProc {
        child,
        stdin: Some(stdin),
    };
    Ok((proc_, addr))
}

/// Stages `image` to `nodes` node processes started with `cmd`, each with its own cache under
/// `work` (removed afterwards). The processes are started before the clock, as srun starts
/// node agents before staging.
pub fn stage_dir_processes(
    image: &Path,
    nodes: u32,
    k: u32,
    work: &Path,
    opts: StageOptions,
    cmd: &WorkerCommand,
) -> Result<DirStaging, BenchError> {
    let key = JobSecret::generate()?;
    let caches: Vec<PathBuf> = (1..=nodes).map(|i| work.join(format!("proc{i}"))).collect();
    let mut procs = Vec::new();
    let mut plan = Vec::new();
    for (i, cache) in (1..=nodes).zip(&caches) {
        let (p, addr) = spawn(cmd, i, cache, &key, opts)?;
        procs.push(p);
        plan.push((NodeId(i), addr));
    }
    let s = runtime()?
        .block_on(stage_image(image, &plan, k, &key, opts))
        .map_err(|e| BenchError::Run(e.to_string()))?;
    drop(procs);
    summarize(s, &caches, k)
}

/// `vse bench stage-node`: one node's staging server until standard input closes.
pub fn serve_node() -> Result<(), BenchError> {
    let bad = |what: &str| BenchError::Run(format!("stage-node: {what}"));
    let mut line = String::new();
    let mut input = std::io::stdin().lock();
    input
        .read_line(&mut line)
        .map_err(|e| bad(&e.to_string()))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let [id, cache, secret, window, level] = f[..] else {
        return Err(bad("expected `ID CACHE SECRET WINDOW LEVEL`"));
    };
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| bad(&format!("{s}: not a number")))
    };
    let id = u32::try_from(num(id)?).map_err(|_| bad("node id"))?;
    let key = JobSecret::from_hex(secret).map_err(|e| bad(&e.to_string()))?;
    let level = i32::try_from(num(level)?).map_err(|_| bad("level"))?;
    let opts = StageOptions {
        window: num(window)?,
        compress: (level > 0).then_some(level),
        ..StageOptions::default()
    };
    let rt = runtime()?;
    let server = rt
        .block_on(StageServer::start(
            [127, 0, 0, 1].into(),
            NodeId(id),
            key,
            PathBuf::from(cache),
            opts,
            None,
        ))
        .map_err(|e| bad(&e.to_string()))?;
    println!("{}", server.addr);
    std::io::stdout().flush().map_err(|e| bad(&e.to_string()))?;
    // Served by the runtime's threads until the benchmark closes our input.
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut input, &mut rest);
    drop(server);
    drop(rt);
    Ok(())
}
