//! Child processes timed from the outside: wall time, and the child's own peak resident set
//! from `wait4`.

use crate::BenchError;
use crate::stats::ms;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One measured child process.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Measured {
    pub wall_ms: f64,
    /// The child's own peak resident set (wait4's rusage), KiB.
    pub max_rss_kib: u64,
}

/// The median wall time and the median peak memory of several runs (each on its own).
pub fn median_of(v: &[Measured]) -> Measured {
    let w: Vec<f64> = v.iter().map(|m| m.wall_ms).collect();
    let r: Vec<u64> = v.iter().map(|m| m.max_rss_kib).collect();
    Measured {
        wall_ms: crate::stats::median(&w).unwrap_or(0.0),
        max_rss_kib: crate::stats::median(&r).unwrap_or(0),
    }
}

/// Runs `c` to completion with stdout to `stdout`; fails on a non-zero exit.
pub fn run_measured(mut c: Command, stdout: &Path) -> Result<Measured, BenchError> {
    let out = std::fs::File::create(stdout)
        .map_err(BenchError::io(format!("creating {}", stdout.display())))?;
    let err_path = stdout.with_extension("err");
    let err = std::fs::File::create(&err_path)
        .map_err(BenchError::io(format!("creating {}", err_path.display())))?;
    c.stdin(Stdio::null()).stdout(out).stderr(err);
    let t = Instant::now();
    let child = c
        .spawn()
        .map_err(BenchError::io("starting the measured command"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 fills `status` and `ru` for the child we just spawned, which nothing
    // else reaps (the `Child` handle is dropped without waiting).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    drop(child);
    if r != pid {
        return Err(BenchError::io("wait4")(std::io::Error::last_os_error()));
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(BenchError::Failed(format!(
            "{:?} failed (status {status:#x}): {}",
            c.get_program(),
            std::fs::read_to_string(&err_path).unwrap_or_default()
        )));
    }
    Ok(Measured {
        wall_ms: ms(wall),
        max_rss_kib: ru.ru_maxrss as u64,
    })
}

/// This process's own peak resident set, KiB.
pub fn self_max_rss_kib() -> u64 {
    // SAFETY: rusage is plain data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as u64
}

/// Runs `c` (stdout discarded) and times it; `what` names it in the log and in errors.
pub fn timed(what: &str, c: Command, step: crate::Step) -> Result<Duration, BenchError> {
    timed_output(what, c, step).map(|(t, _)| t)
}

/// [`timed`], with what the command printed on stdout (a `--json` report).
pub fn timed_output(
    what: &str,
    mut c: Command,
    step: crate::Step,
) -> Result<(Duration, Vec<u8>), BenchError> {
    step(what);
    let t = Instant::now();
    let out = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(BenchError::io(format!("starting {what}")))?;
    let took = t.elapsed();
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok((took, out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_runs_take_each_figure_on_its_own() {
        let runs = [
            Measured {
                wall_ms: 3.0,
                max_rss_kib: 10,
            },
            Measured {
                wall_ms: 1.0,
                max_rss_kib: 30,
            },
            Measured {
                wall_ms: 2.0,
                max_rss_kib: 20,
            },
        ];
        assert_eq!(
            median_of(&runs),
            Measured {
                wall_ms: 2.0,
                max_rss_kib: 20
            }
        );
    }

    #[test]
    fn a_failing_child_is_an_error_with_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new("sh");
        c.args(["-c", "echo oops >&2; exit 3"]);
        let e = run_measured(c, &dir.path().join("out")).unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "echo hi"]);
        let m = run_measured(c, &dir.path().join("out")).unwrap();
        assert!(m.max_rss_kib > 0);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out")).unwrap(),
            "hi\n"
        );
    }
}
