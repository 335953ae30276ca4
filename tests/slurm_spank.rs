//! `srun --vse=…` end to end: the real Slurm cluster of `.ci/slurm-up.sh` with the vse SPANK
//! plugin (built from plugins/spank, configured in its plugstack.conf), this build's `vse`
//! behind it, real TCG VMs of the minimal image.
//!
//! Needs root, QEMU, Slurm with libslurm-dev (the plugin), VSE_GUEST_AGENT and the bookworm
//! lists (to build the test image).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::vm::{built_image, vm_slot, vm_tools};
use testkit::process::pids_with;

const VSE: &str = env!("CARGO_BIN_EXE_vse");

struct Cluster {
    dir: PathBuf,
}

/// The cluster with the plugin pointing at this build's `vse`, or None after "skipped: …"
/// (a failure under VSE_REQUIRE_ALL).
fn cluster() -> Option<Cluster> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if !vm_tools()
        || !testkit::tool("srun")
        || !testkit::require(
            root,
            "root (slurmd and the plugin's node service)",
            "run the tests as root",
        )
    {
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/slurm-up.sh");
    let up = Command::new("sh").arg(script).output().unwrap();
    assert!(
        up.status.success(),
        "slurm-up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let dir = PathBuf::from(
        std::env::var("VSE_SLURM_DIR").unwrap_or_else(|_| "/tmp/vse-slurm".to_string()),
    );
    let plugstack = std::fs::read_to_string(dir.join("plugstack.conf")).unwrap_or_default();
    if !testkit::require(
        plugstack.starts_with("required ") && dir.join("vse_spank.so").exists(),
        "the vse SPANK plugin",
        "apt-get install libslurm-dev, then bash .ci/slurm-up.sh",
    ) {
        return None;
    }
    // plugstack.conf names $DIR/bin/vse: make it this build (renamed into place atomically).
    let tmp = dir.join(format!("bin/.vse-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(VSE, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("bin/vse")).unwrap();
    Some(Cluster { dir })
}

impl Cluster {
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("SLURM_CONF", self.dir.join("slurm.conf"))
            .current_dir("/tmp")
            .stdin(Stdio::null());
        c
    }

    fn srun(&self, args: &[&str]) -> Output {
        let o = self.cmd("srun").args(args).output().unwrap();
        eprintln!(
            "srun {args:?} -> {:?}\n--- stdout\n{}--- stderr\n{}---",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// The step directories of the plugin (`run_dir=` in plugstack.conf).
    fn run_dir(&self) -> PathBuf {
        self.dir.join("spank-run")
    }

    fn steps(&self) -> Vec<String> {
        std::fs::read_dir(self.run_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every QEMU and node service of the plugin has exited and every step directory is gone,
    /// waiting up to a minute.
    fn nothing_left(&self) {
        let needle = self.run_dir().to_string_lossy().into_owned();
        let t0 = Instant::now();
        loop {
            let qemu = pids_with(&["qemu", &needle]);
            let service = pids_with(&["spank", "node", &needle]);
            let steps = self.steps();
            if qemu.is_empty() && service.is_empty() && steps.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "left behind: QEMU {qemu:?}, services {service:?}, step directories {steps:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The id the next job would get: unchanged means no job was created.
    fn next_job_id(&self) -> String {
        let o = self
            .cmd("scontrol")
            .args(["show", "config"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("NEXT_JOB_ID"))
            .unwrap_or_else(|| panic!("no NEXT_JOB_ID in scontrol show config"))
            .to_string()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The kernel release the image's manifest records (what `uname -r` says inside its VMs).
fn guest_kernel(img: &Path) -> String {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(img.join("manifest.json")).unwrap()).unwrap();
    m["kernel_version"].as_str().unwrap().to_string()
}

#[test]
fn srun_runs_each_node_s_task_in_a_vm() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let vse = format!("--vse={}", img.display());
    let o = c.srun(&["-N2", &vse, "uname", "-r"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let kernel = guest_kernel(&img);
    let lines: Vec<String> = text(&o.stdout).lines().map(str::to_string).collect();
    assert_eq!(
        lines,
        vec![kernel.clone(), kernel],
        "two tasks, two guest kernels"
    );
    c.nothing_left();
}

#[test]
fn tasks_keep_their_environment_ranks_and_directory_and_share_their_node_s_vm() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let vse = format!("--vse={}", img.display());
    let script = "echo \"rank=$SLURM_PROCID of=$SLURM_NTASKS local=$SLURM_LOCALID \
                  x=$VSE_TEST_X cwd=$(pwd) boot=$(cat /proc/sys/kernel/random/boot_id)\"";
    let o = c
        .cmd("srun")
        .args(["-N1", "-n2", &vse, "sh", "-c", script])
        .env("VSE_TEST_X", "from the submit shell")
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{out}");
    for (rank, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(&format!(
                "rank={rank} of=2 local={rank} x=from the submit shell cwd=/tmp boot="
            )),
            "{l}"
        );
    }
    // One VM per node: both tasks saw the same boot.
    let boot = |l: &str| l.rsplit_once("boot=").unwrap().1.to_string();
    assert_eq!(boot(lines[0]), boot(lines[1]), "{out}");
    // The host's boot is another one.
    let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_ne!(boot(lines[0]), host.trim());
    c.nothing_left();
}

#[test]
fn the_task_s_exit_status_is_the_command_s() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let vse = format!("--vse={}", img.display());
    // What srun forwards to the task reaches the command, and so does its end (`cat` ends).
    let mut child = c
        .cmd("srun")
        .args([&vse, "sh", "-c", "cat; echo out; echo err >&2; exit 7"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"data 1\ndata 2\n").unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "data 1\ndata 2\nout\n");
    assert!(text(&o.stderr).contains("err\n"), "{}", text(&o.stderr));
    // A command missing from the image: the task fails, it does not hang.
    let o = c.srun(&[&vse, "/no/such/program"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("/no/such/program"),
        "{}",
        text(&o.stderr)
    );
    c.nothing_left();
}

/// The cgroups (v1) of process `pid`: hierarchy -> path.
fn cgroups_of(pid: u32) -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrl, path) = (it.next()?, it.next()?, it.next()?);
            Some((ctrl.to_string(), path.to_string()))
        })
        .collect()
}

/// `VmRSS` (bytes) and user + system CPU time (seconds) of a live process.
fn rss_and_cpu(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .unwrap_or(0)
        << 10;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, r)| r.split(' ').collect());
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (rss, (ticks(11) + ticks(12)) / hz)
}

/// sacct's `MaxRSS` (`229232K`) in bytes and `TotalCPU` (`[D-][HH:]MM:SS[.mmm]`) in seconds.
fn parse_sacct(max_rss: &str, total_cpu: &str) -> (u64, f64) {
    let rss = match max_rss.char_indices().last() {
        Some((i, u @ ('K' | 'M' | 'G'))) => {
            let shift = match u {
                'K' => 10,
                'M' => 20,
                _ => 30,
            };
            (max_rss[..i].parse::<f64>().unwrap_or(0.0) * (1u64 << shift) as f64) as u64
        }
        _ => max_rss.parse().unwrap_or(0),
    };
    let (days, clock) = total_cpu.split_once('-').unwrap_or(("0", total_cpu));
    let secs = clock
        .split(':')
        .fold(0.0, |acc, p| acc * 60.0 + p.parse::<f64>().unwrap_or(0.0));
    (rss, days.parse::<f64>().unwrap_or(0.0) * 86400.0 + secs)
}

/// As a site runs Slurm (proctrack/cgroup, task/cgroup with ConstrainRAMSpace,
/// jobacct_gather/cgroup), for an ordinary user's `srun --vse`: a VM larger than the job's
/// memory is refused before it boots, with the numbers; a running step's QEMU is in the step's
/// cgroups, bounded by the job's memory; `scancel` leaves no process, step directory or cgroup;
/// and `sacct` reports the VM's memory and CPU time as the step's, more than vse's own
/// processes used.
#[test]
fn a_step_s_vm_is_the_job_s_bounded_accounted_and_gone_with_scancel() {
    let Some(c) = cluster() else { return };
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let vse = format!("--vse={}", img.display());
    let srun = || {
        let mut cmd = t.command("srun");
        cmd.env("SLURM_CONF", c.dir.join("slurm.conf"))
            .current_dir("/tmp")
            .stdin(Stdio::null());
        cmd
    };
    // Refused up front: the node service reads the job's limit before QEMU starts.
    let o = srun()
        .args(["-N1", "--mem=300", "--vse-memory=512M", &vse, "true"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a VM of 512 MiB")
            && err.contains("more than the 300 MiB this job may use")
            && err.contains("--mem"),
        "{err}"
    );
    c.nothing_left();

    let name = format!("vse-scancel-{}", std::process::id());
    let mut run = srun()
        .args([
            "-N2",
            "--mem=1200",
            "-J",
            &name,
            &vse,
            "sh",
            "-c",
            "echo started; sleep 600",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the guest to run the command (its output is on the way), not just for QEMU.
    let mut out = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    assert_eq!(first, "started\n");
    let needle = c.run_dir().to_string_lossy().into_owned();
    let qemu = pids_with(&["qemu", &needle]);
    assert_eq!(qemu.len(), 2, "one VM per node");
    let q = c
        .cmd("squeue")
        .args(["-h", "-n", &name, "-o", "%i"])
        .output()
        .unwrap();
    let job = text(&q.stdout).trim().to_string();
    assert!(!job.is_empty(), "job {name} not in squeue");
    let step = format!("/uid_{}/job_{job}/step_0", t.uid);
    let mut others = Vec::new();
    for &pid in &qemu {
        let cg = cgroups_of(pid);
        for h in ["memory", "cpuacct", "freezer"] {
            let path = cg.get(h).map_or("", String::as_str);
            assert!(
                path.contains(&format!("{step}/")) || path.ends_with(&step),
                "QEMU {pid} is not in the step's {h} cgroup: {cg:?}"
            );
        }
        // The job's --mem bounds the step the VM is in.
        let mem = cg["memory"].clone();
        let step_dir = &mem[..mem.find(&step).unwrap() + step.len()];
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory{step_dir}/memory.limit_in_bytes"
        ))
        .unwrap();
        assert_eq!(limit.trim(), (1200u64 << 20).to_string(), "{step_dir}");
        // vse's own processes in the same cgroup: what the step would use without its VM.
        let procs =
            std::fs::read_to_string(format!("/sys/fs/cgroup/memory{mem}/cgroup.procs")).unwrap();
        others.extend(
            (procs.lines())
                .filter_map(|p| p.parse::<u32>().ok())
                .filter(|p| !qemu.contains(p)),
        );
    }
    assert!(
        !others.is_empty(),
        "the node service and tasks are in the step too"
    );
    let (vse_rss, vse_cpu) = others
        .iter()
        .map(|&p| rss_and_cpu(p))
        .fold((0u64, 0.0f64), |(r, c), (pr, pc)| (r.max(pr), c + pc));
    // Sampled every 2 s (JobAcctGatherFrequency): let a sample see the booted guest.
    std::thread::sleep(Duration::from_secs(3));
    let st = c.cmd("scancel").arg(&job).status().unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    while run.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "srun still running");
        std::thread::sleep(Duration::from_millis(200));
    }
    c.nothing_left();
    // Slurm removes the job's cgroups once their processes are gone.
    let t0 = Instant::now();
    loop {
        let left: Vec<String> = ["memory", "cpuacct", "freezer"]
            .iter()
            .flat_map(|h| {
                ["n1", "n2", "n3", "n4"]
                    .map(|n| format!("/sys/fs/cgroup/{h}/slurm_{n}/uid_{}/job_{job}", t.uid))
            })
            .filter(|d| Path::new(d).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "cgroups left: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The accounting record: the step's memory peak and CPU time include its VMs'.
    let t0 = Instant::now();
    let (rss, cpu) = loop {
        let o = c
            .cmd("sacct")
            .args([
                "-n",
                "-P",
                "-j",
                &format!("{job}.0"),
                "--format=MaxRSS,TotalCPU,State",
            ])
            .output()
            .unwrap();
        let line = text(&o.stdout);
        let f: Vec<&str> = line.trim().split('|').collect();
        if f.len() == 3 && !f[0].is_empty() && f[2].starts_with("CANCELLED") {
            break parse_sacct(f[0], f[1]);
        }
        // slurmctld hands finished steps to slurmdbd in the background, which has taken
        // over 30 s on a loaded 2-core machine.
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no accounting record of step {job}.0: {line}{}",
            text(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "sacct {job}.0: MaxRSS {} MiB, TotalCPU {cpu:.1} s; vse's own processes: {} MiB, {vse_cpu:.1} s",
        rss >> 20,
        vse_rss >> 20
    );
    assert!(
        rss > vse_rss + (64 << 20),
        "MaxRSS {rss} is not the VM's: vse alone {vse_rss}"
    );
    assert!(
        cpu > vse_cpu + 1.0,
        "TotalCPU {cpu} s is not the VM's: vse alone {vse_cpu} s"
    );
}

#[test]
fn sacct_fields_parse() {
    assert_eq!(parse_sacct("229232K", "00:18.017"), (229232 << 10, 18.017));
    assert_eq!(parse_sacct("1.5G", "1-01:00:00"), (3 << 29, 90000.0));
}

#[test]
fn a_step_past_its_time_limit_leaves_nothing() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let vse = format!("--vse={}", img.display());
    // Slurm's smallest limit is a minute; its check runs about every 30 s after that.
    let o = c.srun(&["--time=1", &vse, "sh", "-c", "echo started; sleep 600"]);
    assert_eq!(text(&o.stdout), "started\n");
    assert!(
        text(&o.stderr).contains("DUE TO TIME LIMIT"),
        "{}",
        text(&o.stderr)
    );
    c.nothing_left();
}

#[test]
fn bad_requests_fail_in_srun_before_anything_starts() {
    let Some(c) = cluster() else { return };
    let before = (c.next_job_id(), c.steps());
    let o = c.srun(&["-N2", "--vse=/nonexistent/image", "true"]);
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("--vse=/nonexistent/image") && err.contains("does not exist"),
        "{err}"
    );
    // The site policy of plugstack.conf holds whatever the user asks.
    let img = c.dir.clone();
    let o = c.srun(&[&format!("--vse={}", img.display()), "true"]);
    assert!(
        text(&o.stderr).contains("no manifest.json"),
        "{}",
        text(&o.stderr)
    );
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/minimal.vse.yaml");
    let o = c.srun(&[
        &format!("--vse={}", spec.display()),
        "--vse-vcpus=64",
        "true",
    ]);
    let err = text(&o.stderr);
    assert!(
        err.contains("--vse-vcpus=64")
            && err.contains("allows at most 32")
            && err.contains("site.policy.yaml"),
        "{err}"
    );
    let o = c.srun(&["--vse-memory=2G", "true"]);
    assert!(
        text(&o.stderr).contains("need --vse=IMAGE|SPEC"),
        "{}",
        text(&o.stderr)
    );
    // A spec the node would have to run commands of as root.
    let tmp = tempfile::tempdir().unwrap();
    let evil = tmp.path().join("evil.vse.yaml");
    let base = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(
        &evil,
        format!("{base}post_install:\n  - touch /tmp/pwned\n"),
    )
    .unwrap();
    let o = c.srun(&[&format!("--vse={}", evil.display()), "true"]);
    let err = text(&o.stderr);
    assert!(
        err.contains("post_install") && err.contains("evil.vse.yaml:"),
        "{err}"
    );
    // A user's own audit file: the step's record goes to the site's only.
    let mine = tmp.path().join("mine.policy.yaml");
    std::fs::write(
        &mine,
        "version: 1\nname: mine\naudit:\n  file: /tmp/mine.jsonl\n",
    )
    .unwrap();
    let o = c.srun(&[
        &format!("--vse={}", spec.display()),
        &format!("--vse-policy={}", mine.display()),
        "true",
    ]);
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("audit.file") && err.contains("mine.policy.yaml:4:"),
        "{err}"
    );
    assert_eq!(
        (c.next_job_id(), c.steps()),
        before,
        "a job or step was created"
    );
}

#[test]
fn sbatch_vse_applies_to_the_job_s_steps() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH --vse={}\n#SBATCH -N1\necho batch-on-host $(uname -r)\nsrun uname -r\n",
            img.display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("job.out");
    let o = c
        .cmd("sbatch")
        .arg("--parsable")
        .arg(format!("--output={}", out.display()))
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let job = text(&o.stdout).trim().to_string();
    // Polled here: `sbatch --wait` backs off to long sleeps between its own polls.
    let t0 = Instant::now();
    let state = loop {
        let o = c
            .cmd("scontrol")
            .args(["show", "job", &job])
            .output()
            .unwrap();
        let info = text(&o.stdout);
        let state = info
            .split_whitespace()
            .find_map(|w| w.strip_prefix("JobState="))
            .unwrap_or("")
            .to_string();
        if !matches!(
            state.as_str(),
            "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"
        ) {
            break state;
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "job {job}: {info}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let log = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "{log}");
    let host = text(&Command::new("uname").arg("-r").output().unwrap().stdout);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        vec![format!("batch-on-host {}", host.trim()), guest_kernel(&img)],
        "the batch script runs on the host, its srun step in the VM"
    );
    c.nothing_left();
}

#[test]
fn a_spec_is_built_on_the_node() {
    let Some(c) = cluster() else { return };
    if !support::host_lists() {
        return;
    }
    let _slot = vm_slot();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/minimal.vse.yaml");
    let o = c.srun(&[
        &format!("--vse={}", spec.display()),
        "cat",
        "/etc/vse/site.conf",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The site policy of plugstack.conf was applied to the build (its required file).
    assert!(
        text(&o.stdout).contains("site=example-hpc"),
        "{}",
        text(&o.stdout)
    );
    c.nothing_left();
}

/// The job user races symlinks into every place of its step it can write (console log,
/// QEMU's stderr, profile, the overlay), each pointing at a root-owned canary outside the
/// step, for the whole of an `srun --vse=SPEC` step. Root must never write through them: the
/// node service builds as root, then QEMU runs as the user, whose writes through the links
/// are refused by the kernel. The step fails cleanly or runs; the canary never changes.
#[test]
fn a_spec_step_never_writes_through_the_job_user_s_links() {
    let Some(c) = cluster() else { return };
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    if !support::host_lists() {
        return;
    }
    let _slot = vm_slot();
    // The canary: root's, in a directory only root can enter.
    let vault = tempfile::tempdir().unwrap();
    let canary = vault.path().join("canary");
    std::fs::write(&canary, "root's own bytes\n").unwrap();
    let before = std::fs::metadata(&canary).unwrap().modified().unwrap();
    let scratch = t.scratch("spank-links");
    let stop = scratch.path().join("stop");
    let script = r#"
run=$1 canary=$2 stop=$3 n=0
while [ ! -e "$stop" ]; do
  for vm in "$run"/*/vm; do
    [ -w "$vm" ] || continue
    pid=$(cat "${vm%/vm}/node.pid" 2>/dev/null)
    mkdir -p "$vm/v2m/spank-$pid" 2>/dev/null
    for f in "$vm/console.log" "$vm/qemu.stderr" "$vm/v2m/spank-$pid/console.log" \
             "$vm/v2m/spank-$pid/qemu.stderr" "$vm/v2m/spank-$pid/profile.json" \
             "$vm/v2m/spank-$pid/vm.json" "$vm/v2m/kvm-check.json"; do
      ln -s "$canary" "$f" 2>/dev/null && n=$((n+1))
    done
    for s in "$vm"/vse-*; do
      [ -d "$s" ] && ln -s "$canary" "$s/root.qcow2" 2>/dev/null && n=$((n+1))
    done
  done
done
echo "planted $n"
"#;
    let racer = t
        .command("sh")
        .args(["-c", script, "racer"])
        .arg(c.run_dir())
        .arg(&canary)
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/minimal.vse.yaml");
    let o = t
        .command("srun")
        .env("SLURM_CONF", c.dir.join("slurm.conf"))
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .args([
            &format!("--vse={}", spec.display()),
            "cat",
            "/etc/vse/site.conf",
        ])
        .output()
        .unwrap();
    std::fs::write(&stop, "").unwrap();
    let planted = text(&racer.wait_with_output().unwrap().stdout);
    eprintln!(
        "srun as {} -> {:?}\n{}{}{planted}",
        t.name,
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    );
    let n: u32 = planted
        .trim()
        .strip_prefix("planted ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        n > 0,
        "the racer never reached the step's directory: {planted}"
    );
    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "root's own bytes\n",
        "root wrote through a link the job user planted"
    );
    assert_eq!(
        std::fs::metadata(&canary).unwrap().modified().unwrap(),
        before
    );
    // Ran (the links were refused or never used) or failed with the reason, not a hang.
    if o.status.success() {
        assert!(
            text(&o.stdout).contains("site=example-hpc"),
            "{}",
            text(&o.stdout)
        );
    } else {
        assert!(!text(&o.stderr).trim().is_empty());
    }
    c.nothing_left();
}

/// A signed image of the job user's, its root disk and manifest swapped by rename in a loop
/// (as the job user) during `srun --vse=IMAGE`: the node opens the image once with the
/// user's rights, copies it into its root-owned store checking every part against the
/// signed manifest, and boots the copy. The guest never sees the swapped disk; a try either
/// boots the signed bytes or is refused. Once the racer stops, the image boots.
#[test]
fn swapping_a_signed_image_during_srun_never_boots_the_swapped_bytes() {
    use support::signing::{PROBE, RACER, SwapKit, chmod, readable_site_key, who};
    let Some(c) = cluster() else { return };
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    // The site's key and a policy naming it: root's files the job user may read.
    let (keys, k) = readable_site_key();
    let policy = keys.path().join("signed.policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nname: signed\nimages:\n  signed_by: [{}]\n",
            k.public.display()
        ),
    )
    .unwrap();
    chmod(&policy, 0o644);
    let scratch = t.scratch("srun-swap");
    let kit = SwapKit::new(&t, &img, scratch.path());
    let store = std::env::var_os("VSE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/vse"), PathBuf::from)
        .join("admitted");
    let srun_in = |dir: &Path, extra: &[&str], script: &str| {
        let o = t
            .command("srun")
            .env("SLURM_CONF", c.dir.join("slurm.conf"))
            // As the user's shell sets it: the node learns the step's directory from it.
            .env("PWD", dir)
            .current_dir(dir)
            .stdin(Stdio::null())
            .arg(format!("--vse={}", kit.img.display()))
            .arg(format!("--vse-policy={}", policy.display()))
            .args(extra)
            .args(["sh", "-c", script])
            .output()
            .unwrap();
        eprintln!(
            "srun -> {:?}\n{}{}",
            o.status.code(),
            text(&o.stdout),
            text(&o.stderr)
        );
        o
    };
    let srun = || srun_in(Path::new("/tmp"), &[], PROBE);
    let mut copies = Vec::new();
    for n in 0..2 {
        kit.arm(&t, n, &k);
        copies.push(store.join(kit.digest()));
        let racer = t
            .command("sh")
            .args(["-c", RACER, "racer"])
            .arg(&kit.img)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let o = srun();
        t.write(&kit.img.join("stop"), "");
        eprintln!("racer: {}", text(&racer.wait_with_output().unwrap().stdout));
        assert!(
            !text(&o.stdout).contains("SWAPPED"),
            "try {n} booted the swapped disk"
        );
        if o.status.success() {
            assert!(text(&o.stdout).starts_with("clean\n"), "try {n}");
        }
    }
    kit.arm(&t, 2, &k);
    kit.settle();
    copies.push(store.join(kit.digest()));
    // From a directory of the user's (shared by default), with a read-only share of another.
    let (job, refs) = (scratch.path().join("job"), scratch.path().join("refs"));
    for d in [&job, &refs] {
        std::fs::create_dir(d).unwrap();
        t.chown(d);
    }
    t.write(&refs.join("table"), "ref\n");
    let share = format!("--vse-share={}:/refs:ro", refs.display());
    let script =
        format!("{PROBE}; cat /refs/table; echo out > result.txt; touch /refs/x || echo ro");
    let o = srun_in(&job, &[&share], &script);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The task ran as the job's user, in its submit directory, shared with the VM.
    assert_eq!(
        text(&o.stdout),
        format!("clean\n{}\ncwd={}\nref\nro\n", who(&t), job.display())
    );
    let result = job.join("result.txt");
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "out\n");
    let meta = std::fs::metadata(&result).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta)
        ),
        (t.uid, t.gid)
    );
    assert!(!refs.join("x").exists());
    // The node recorded each step before it booted, in the user's name (the site policy of
    // plugstack.conf names the audit file, `.ci/slurm-up.sh`).
    let o = Command::new(VSE)
        .args([
            "audit",
            "--json",
            "--user",
            "vse-tester",
            "--action",
            "launch",
            "--file",
        ])
        .arg(c.dir.join("audit/audit.jsonl"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let steps = (doc["records"].as_array().into_iter().flatten())
        .filter(|r| {
            r["outcome"] == "allowed"
                && r["uid"] == t.uid
                && r["detail"] == format!("srun --vse={}", kit.img.display()).as_str()
                && r["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("sha256:"))
                && r["job"].as_str().is_some_and(|j| j.parse::<u64>().is_ok())
        })
        .count();
    assert!(steps >= 1, "no record of the steps: {doc}");
    for copy in copies {
        let _ = std::fs::remove_dir_all(copy);
    }
    c.nothing_left();
}

/// `srun --vse` under `images.signed_by` (here from --vse-policy, naming a root-owned keyring):
/// an image unsigned, signed by another key, by an expired or revoked key, by a non-signing
/// subkey, or changed since it was signed fails srun before a job exists; a spec, which the
/// node would build unsigned, is refused by the node with the reason.
#[test]
fn srun_refuses_images_not_signed_by_a_valid_key_and_specs_under_signed_by() {
    use support::signing::{Kind, key, tiny_image};
    let Some(c) = cluster() else { return };
    let keys = tempfile::tempdir().unwrap();
    let k = |name, kind, seed| key(keys.path(), name, kind, seed);
    let (site, other) = (k("site", Kind::Good, 1), k("other", Kind::Good, 2));
    let cases = [
        ("unsigned", &site, None, false, "no signature"),
        ("another key", &site, Some(&other), false, "not by a key of"),
        (
            "tampered part",
            &site,
            Some(&site),
            true,
            "does not match the signed manifest",
        ),
    ];
    let expired = k("expired", Kind::Expired, 3);
    let revoked = k("revoked", Kind::Revoked, 4);
    let subkey = k("subkey", Kind::NonSigningSubkey, 5);
    let more = [
        (
            "expired key",
            &expired,
            Some(&expired),
            false,
            "the key expired on",
        ),
        (
            "revoked key",
            &revoked,
            Some(&revoked),
            false,
            "the key is revoked",
        ),
        (
            "non-signing subkey",
            &subkey,
            Some(&subkey),
            false,
            "is not a signing subkey",
        ),
    ];
    let policy = |trusted: &support::signing::Key| {
        let p = keys
            .path()
            .join(format!("{}.policy.yaml", trusted.public.display()).replace('/', "_"));
        std::fs::write(
            &p,
            format!(
                "version: 1\nname: signed\nimages:\n  signed_by: [{}]\n",
                trusted.public.display()
            ),
        )
        .unwrap();
        p
    };
    let before = c.next_job_id();
    for (name, trusted, signer, tamper, says) in cases.into_iter().chain(more) {
        let t = tempfile::tempdir().unwrap();
        tiny_image(t.path());
        if let Some(s) = signer {
            s.sign(VSE, t.path());
        }
        if tamper {
            std::fs::write(t.path().join("root.ext4"), vec![b'R'; 4096]).unwrap();
        }
        let o = c.srun(&[
            &format!("--vse={}", t.path().display()),
            &format!("--vse-policy={}", policy(trusted).display()),
            "true",
        ]);
        assert_ne!(o.status.code(), Some(0), "{name}");
        assert!(
            text(&o.stderr).contains(says),
            "{name}: {}",
            text(&o.stderr)
        );
    }
    assert_eq!(c.next_job_id(), before, "a job was created");
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/minimal.vse.yaml");
    let o = c.srun(&[
        &format!("--vse={}", spec.display()),
        &format!("--vse-policy={}", policy(&site).display()),
        "true",
    ]);
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("requires signed images") && err.contains("spec is unsigned"),
        "{err}"
    );
    c.nothing_left();
}
