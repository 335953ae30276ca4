//! Job checkpoint and restore against the raw V2M checkpoint of the same VMs, in one run: a
//! two-VM job (`vse launch … --allocation local:2 --checkpoint-dir`) checkpointed on request
//! (`vse checkpoint --job --wait`: every VM paused, saved with its disk, hashed, published)
//! and later restored (`vse launch --restore`, to the ranks' first output); next to two VMs
//! of the same image and size booted through vmhost, checkpointed in parallel through V2M
//! (`Vm::checkpoint`, the memory state only) and restored in parallel up to their guest
//! agents answering.

use crate::{BenchError, Step};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use v2m::Plugin;

const JOB: &str = "bckpt";
const MEMORY_MIB: u64 = 256;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CheckpointBench {
    Measured(Figures),
    Skipped { reason: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub image: PathBuf,
    pub vms: u32,
    pub memory_mib: u64,
    /// Everything the job checkpoint wrote (states and disks).
    pub bytes: u64,
    /// Pause of the first VM to the published checkpoint, as its manifest records.
    pub job_checkpoint_ms: u64,
    /// Both VMs' V2M checkpoints, in parallel.
    pub raw_checkpoint_ms: u64,
    /// job ÷ raw (goal ≤ 1.2).
    pub checkpoint_ratio: f64,
    /// `vse launch --restore` started to the first rank output.
    pub job_restore_ms: u64,
    /// Both VMs' V2M restores, in parallel, to their guest agents answering.
    pub raw_restore_ms: u64,
    pub restore_ratio: f64,
}

pub fn measure(
    image: Option<&Path>,
    vse: &Path,
    step: Step,
) -> Result<CheckpointBench, BenchError> {
    let Some(img) = image
        .map(Path::to_path_buf)
        .or_else(crate::latency::default_image)
    else {
        return Ok(CheckpointBench::Skipped {
            reason: "no image: pass --latency-image DIR (or build the tests' minimal image)".into(),
        });
    };
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-ckpt-")
        .tempdir_in("/tmp")?;
    step("checkpoint: a two-VM job, checkpointed on request");
    let (bytes, job_checkpoint_ms) = job_checkpoint(vse, &img, tmp.path())?;
    step("checkpoint: the job restored");
    let job_restore_ms = job_restore(vse, &img, tmp.path())?;
    step("checkpoint: two VMs through V2M, checkpointed and restored in parallel");
    let (raw_checkpoint_ms, raw_restore_ms) = raw(&img, tmp.path())?;
    Ok(CheckpointBench::Measured(Figures {
        image: img,
        vms: 2,
        memory_mib: MEMORY_MIB,
        bytes,
        job_checkpoint_ms,
        raw_checkpoint_ms,
        checkpoint_ratio: job_checkpoint_ms as f64 / raw_checkpoint_ms.max(1) as f64,
        job_restore_ms,
        raw_restore_ms,
        restore_ratio: job_restore_ms as f64 / raw_restore_ms.max(1) as f64,
    }))
}

fn launch(vse: &Path, img: &Path, tmp: &Path, args: &[&str]) -> Result<Child, BenchError> {
    Ok(Command::new(vse)
        .arg("launch")
        .arg(img)
        .args([
            "--allocation",
            "local:2",
            "--memory",
            &MEMORY_MIB.to_string(),
        ])
        .arg("--state-db")
        .arg(tmp.join(format!("state-{}.db", args.len())))
        .args(args)
        .env("VSE_IMAGE_CACHE", tmp.join("cache"))
        .env("VSE_RUN_DIR", tmp.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Waits until both ranks printed; the time it took. The rest of the output is drained (a
/// closed pipe would end the job with SIGPIPE).
fn both_ranks_out(child: &mut Child) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let out = child
        .stdout
        .take()
        .ok_or(BenchError::Failed("no stdout".into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = [false, false];
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            for (r, s) in seen.iter_mut().enumerate() {
                *s |= l.starts_with(&format!("[rank {r}]"));
            }
            if seen.iter().all(|s| *s) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv()
        .map(|()| t.elapsed())
        .map_err(|_| BenchError::Failed("the job ended before both ranks printed".into()))
}

/// SIGTERM: the job checkpoints and stops (exit 106).
fn stop(mut child: Child) -> Result<(), BenchError> {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    match child.wait()? {
        s if s.code() == Some(106) => Ok(()),
        s => Err(BenchError::Failed(format!(
            "vse launch ended with {s}, not 106"
        ))),
    }
}

fn job_checkpoint(vse: &Path, img: &Path, tmp: &Path) -> Result<(u64, u64), BenchError> {
    let dir = tmp.join("ckpts");
    let count = "i=0; while true; do i=$((i+1)); echo $i; sleep 0.2; done";
    let d = dir.to_string_lossy();
    let args = [
        "--job",
        JOB,
        "--checkpoint-dir",
        &d,
        "--",
        "sh",
        "-c",
        count,
    ];
    let mut child = launch(vse, img, tmp, &args)?;
    both_ranks_out(&mut child)?;
    let o = Command::new(vse)
        .args(["checkpoint", "--job", JOB, "--wait", "--json", "--db"])
        .arg(tmp.join(format!("state-{}.db", args.len())))
        .output()?;
    if !o.status.success() {
        return Err(BenchError::Failed(format!(
            "vse checkpoint: {}",
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    stop(child)?;
    let m = launcher::ckpt::load(&dir.join("ckpt-1"))?;
    Ok((m.manifest.bytes(), m.manifest.duration_ms))
}

fn job_restore(vse: &Path, img: &Path, tmp: &Path) -> Result<u64, BenchError> {
    let d = tmp.join("ckpts").join("ckpt-1");
    let mut child = launch(vse, img, tmp, &["--restore", &d.to_string_lossy()])?;
    let took = both_ranks_out(&mut child)?;
    stop(child)?;
    Ok(took.as_millis() as u64)
}

/// Two VMs through vmhost, checkpointed in parallel, then restored in parallel.
fn raw(img: &Path, tmp: &Path) -> Result<(u64, u64), BenchError> {
    let image = vse_image::ImageDir::open(img)?;
    let plugin = v2m::qemu::QemuPlugin::new(v2m::qemu::QemuConfig {
        run_root: tmp.join("raw-run"),
        ephemeral: true,
        ..v2m::qemu::QemuConfig::default()
    });
    let opts = vmhost::BootOptions::new("bench-ckpt", Duration::from_secs(300));
    let mut vms = Vec::new();
    for i in 0..2 {
        let spec = vmhost::VmSpec::new(&image, format!("bench-ckpt-{i}").parse()?, 1, MEMORY_MIB);
        vms.push(vmhost::boot(&plugin, &spec, &opts)?);
    }
    let t = Instant::now();
    let saved: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = vms
            .iter_mut()
            .enumerate()
            .map(|(i, vm)| {
                let file = tmp.join(format!("raw-{i}.state"));
                s.spawn(move || vm.vm_mut().checkpoint(&file).map(|_| file))
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    let checkpoint_ms = t.elapsed().as_millis() as u64;
    let mut files = Vec::new();
    for r in saved {
        files.push(r.map_err(|_| BenchError::Failed("checkpoint thread panicked".into()))??);
    }
    // The VMs stay (paused) so their disks stay for the restores; their profiles go along.
    let profiles: Vec<v2m::Profile> = vms.iter().map(|v| v.profile().clone()).collect();
    for vm in &mut vms {
        let _ = vm.vm_mut().stop(Duration::ZERO);
    }
    let t = Instant::now();
    let restored: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = profiles
            .iter()
            .zip(&files)
            .map(|(p, f)| {
                let (plugin, opts) = (&plugin, &opts);
                s.spawn(move || -> Result<_, BenchError> {
                    let mut vm = plugin.restore(p, f)?;
                    let sock = vm.agent_socket().map(Path::to_path_buf);
                    let sock = sock.ok_or(BenchError::Failed("no agent socket".into()))?;
                    let channel = vm.take_agent_channel();
                    let link = vse_guest_agent::GuestLink::connect_then(
                        &sock,
                        channel,
                        &opts.agent,
                        || Ok(()),
                    )?;
                    Ok((vm, link))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    let restore_ms = t.elapsed().as_millis() as u64;
    for r in restored {
        r.map_err(|_| BenchError::Failed("restore thread panicked".into()))??;
    }
    drop(vms);
    Ok((checkpoint_ms, restore_ms))
}

impl std::fmt::Display for CheckpointBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = match self {
            CheckpointBench::Skipped { reason } => {
                return writeln!(f, "job checkpoint/restore: skipped ({reason})");
            }
            CheckpointBench::Measured(m) => m,
        };
        writeln!(
            f,
            "job checkpoint/restore ({} VMs of {} MiB, {} MiB saved), next to V2M on the same VMs:",
            m.vms,
            m.memory_mib,
            m.bytes >> 20
        )?;
        writeln!(
            f,
            "  checkpoint  vse job {:>6} ms   raw V2M {:>6} ms   {:.2}x (goal <= 1.2x)",
            m.job_checkpoint_ms, m.raw_checkpoint_ms, m.checkpoint_ratio
        )?;
        writeln!(
            f,
            "  restore     vse job {:>6} ms   raw V2M {:>6} ms   {:.2}x (vse: to the ranks' output)",
            m.job_restore_ms, m.raw_restore_ms, m.restore_ratio
        )
    }
}
