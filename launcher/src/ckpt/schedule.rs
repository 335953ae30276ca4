//! When a job checkpoints: before its walltime ends (with a safety margin that follows the
//! measured checkpoint time), every `interval`, and on the batch system's termination signal.
//! The walltime comes from the batch system (Slurm's time left, PBS's limit minus what was
//! used) or from `--walltime` for other allocations.

use super::Reason;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whatever the estimate, the margin is never below this.
const MIN_MARGIN: Duration = Duration::from_secs(3);

/// A failed walltime checkpoint is tried again after this long.
const RETRY: Duration = Duration::from_secs(2);

/// Before any checkpoint was measured: a conservative rate of saving guest memory.
const ASSUMED_BYTES_PER_S: u64 = 100 << 20;

#[derive(Debug, Clone)]
pub struct Schedule {
    /// When the allocation ends, if it does.
    pub end: Option<Instant>,
    /// Checkpoint before `end` (the spec's wish or a policy's rule).
    pub at_walltime_end: bool,
    /// Checkpoint every so often (the spec's `periodic` interval, bounded by the policy).
    pub every: Option<Duration>,
    /// Guest memory of every VM of the job: the first estimate of a checkpoint's length.
    pub memory_bytes: u64,
    last: Instant,
    took: Option<Duration>,
    walltime_done: bool,
    /// A walltime checkpoint that failed (a VM still booting, say) is tried again from here.
    retry: Option<Instant>,
}

impl Schedule {
    pub fn new(
        end: Option<Instant>,
        at_walltime_end: bool,
        every: Option<Duration>,
        memory_bytes: u64,
    ) -> Self {
        Self {
            end,
            at_walltime_end,
            every,
            memory_bytes,
            last: Instant::now(),
            took: None,
            walltime_done: false,
            retry: None,
        }
    }

    /// How long before the walltime ends the checkpoint starts: twice the last measured
    /// checkpoint (or the estimate from the job's memory), plus a little.
    pub fn margin(&self) -> Duration {
        let estimate = self.took.unwrap_or_else(|| {
            Duration::from_secs(1)
                + Duration::from_secs_f64(self.memory_bytes as f64 / ASSUMED_BYTES_PER_S as f64)
        });
        (estimate * 2 + Duration::from_secs(1)).max(MIN_MARGIN)
    }

    /// The next checkpoint due, and why.
    pub fn next(&self) -> Option<(Instant, Reason)> {
        let walltime = (self.at_walltime_end && !self.walltime_done)
            .then_some(self.end)
            .flatten()
            .map(|end| {
                let at = end.checked_sub(self.margin()).unwrap_or(end);
                (self.retry.map_or(at, |r| r.max(at)), Reason::WalltimeEnd)
            });
        let periodic = self.every.map(|d| (self.last + d, Reason::Periodic));
        match (walltime, periodic) {
            (Some(w), Some(p)) => Some(if p.0 < w.0 { p } else { w }),
            (w, p) => w.or(p),
        }
    }

    /// A checkpoint failed at `now`: one at walltime end is tried again shortly while the
    /// allocation lasts (its VMs may still have been booting); a periodic one waits for its
    /// next turn.
    pub fn failed(&mut self, reason: Reason, now: Instant) {
        match reason {
            Reason::WalltimeEnd => {
                let again = now + RETRY;
                match self.end {
                    Some(end) if again < end => self.retry = Some(again),
                    _ => self.walltime_done = true,
                }
            }
            _ => self.last = now,
        }
    }

    /// A checkpoint began at `at` and took `took`.
    pub fn taken(&mut self, reason: Reason, at: Instant, took: Duration) {
        self.last = at + took;
        self.took = Some(took);
        if reason == Reason::WalltimeEnd {
            self.walltime_done = true;
        }
    }
}

/// Where the allocation's end time comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walltime {
    /// `--walltime`: from the launch's start.
    Given(Duration),
    /// Slurm's time left for this job (`squeue -j ID -o %L`).
    Slurm(String),
    /// PBS's walltime limit minus what the job used (`qstat -f ID`).
    Pbs(String),
    /// No end is known.
    None,
}

#[derive(Debug, thiserror::Error)]
pub enum WalltimeError {
    #[error("asking {tool} for the job's time left: {source}")]
    Run {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("{tool} did not say the job's time left: {said:?}")]
    Unreadable { tool: &'static str, said: String },
}

impl vse_exit::Classify for WalltimeError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::MissingComponent
    }
}

impl Walltime {
    /// The allocation's end: `None` when it has none (Slurm's `UNLIMITED`).
    pub fn end(&self, start: Instant) -> Result<Option<Instant>, WalltimeError> {
        let left = match self {
            Walltime::Given(d) => Some(*d),
            Walltime::Slurm(job) => {
                let said = run("squeue", &["-h", "-j", job, "-o", "%L"])?;
                slurm_time_left(&said).ok_or(WalltimeError::Unreadable {
                    tool: "squeue",
                    said,
                })?
            }
            Walltime::Pbs(job) => {
                let said = run("qstat", &["-f", job])?;
                Some(pbs_time_left(&said).ok_or(WalltimeError::Unreadable {
                    tool: "qstat",
                    said: said.lines().take(5).collect::<Vec<_>>().join(" / "),
                })?)
            }
            Walltime::None => None,
        };
        Ok(left.map(|d| start + d))
    }
}

fn run(tool: &'static str, args: &[&str]) -> Result<String, WalltimeError> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|source| WalltimeError::Run { tool, source })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Slurm's `%L`: `[days-]hours:minutes:seconds`, `minutes:seconds`, or `UNLIMITED`
/// (`Some(None)`); anything else is unreadable.
pub fn slurm_time_left(s: &str) -> Option<Option<Duration>> {
    let s = s.trim();
    if s == "UNLIMITED" {
        return Some(None);
    }
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    hms(rest).map(|secs| Some(Duration::from_secs(days * 86_400 + secs)))
}

/// `h:m:s` or `m:s`, in seconds.
fn hms(s: &str) -> Option<u64> {
    let parts: Vec<u64> = s
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    match parts[..] {
        [h, m, sec] => Some(h * 3600 + m * 60 + sec),
        [m, sec] => Some(m * 60 + sec),
        _ => None,
    }
}

/// From `qstat -f`: `Resource_List.walltime` minus `resources_used.walltime`.
pub fn pbs_time_left(qstat: &str) -> Option<Duration> {
    let field = |key: &str| {
        qstat.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| hms(v.trim())).flatten()
        })
    };
    let limit = field("Resource_List.walltime")?;
    let used = field("resources_used.walltime").unwrap_or(0);
    Some(Duration::from_secs(limit.saturating_sub(used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_and_pbs_time_left_are_read() {
        let s = |x: u64| Some(Some(Duration::from_secs(x)));
        assert_eq!(slurm_time_left("4:05"), s(245));
        assert_eq!(slurm_time_left("1:02:03"), s(3723));
        assert_eq!(slurm_time_left("2-00:00:10"), s(172_810));
        assert_eq!(slurm_time_left("UNLIMITED"), Some(None));
        assert_eq!(slurm_time_left("INVALID"), None);
        assert_eq!(slurm_time_left(""), None);
        let q = "Job Id: 12.server\n    Resource_List.walltime = 01:00:00\n    resources_used.walltime = 00:10:30\n";
        assert_eq!(pbs_time_left(q), Some(Duration::from_secs(2970)));
        assert_eq!(pbs_time_left("Job Id: 12.server\n"), None);
    }

    #[test]
    fn the_margin_follows_the_measured_checkpoint_and_periodic_comes_first_when_due() {
        let start = Instant::now();
        let end = start + Duration::from_secs(600);
        let mut s = Schedule::new(Some(end), true, None, 512 << 20);
        // 512 MiB at the assumed rate: about 6 s, doubled.
        assert!(s.margin() >= Duration::from_secs(12), "{:?}", s.margin());
        let (at, why) = s.next().unwrap();
        assert_eq!((at, why), (end - s.margin(), Reason::WalltimeEnd));
        s.taken(Reason::Periodic, start, Duration::from_secs(1));
        assert_eq!(s.margin(), Duration::from_secs(3));
        s.every = Some(Duration::from_secs(60));
        assert_eq!(s.next().unwrap().1, Reason::Periodic);
        s.taken(Reason::WalltimeEnd, start, Duration::from_secs(1));
        assert_eq!(
            s.next().unwrap().1,
            Reason::Periodic,
            "the walltime checkpoint is once"
        );
        let never = Schedule::new(Some(end), false, None, 1 << 30);
        assert_eq!(never.next(), None);
    }
}
