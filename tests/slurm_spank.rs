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
    let o = c.srun(&[&vse, "sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(text(&o.stdout), "out\n");
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

#[test]
fn scancel_of_a_running_step_leaves_nothing() {
    let Some(c) = cluster() else { return };
    let Some(img) = built_image("minimal.vse.yaml") else {
        return;
    };
    let _slot = vm_slot();
    let name = format!("vse-scancel-{}", std::process::id());
    let vse = format!("--vse={}", img.display());
    let mut srun = c
        .cmd("srun")
        .args([
            "-N2",
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
    let mut out = std::io::BufReader::new(srun.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    assert_eq!(first, "started\n");
    let needle = c.run_dir().to_string_lossy().into_owned();
    assert_eq!(pids_with(&["qemu", &needle]).len(), 2, "one VM per node");
    let q = c
        .cmd("squeue")
        .args(["-h", "-n", &name, "-o", "%i"])
        .output()
        .unwrap();
    let job = text(&q.stdout).trim().to_string();
    assert!(!job.is_empty(), "job {name} not in squeue");
    let st = c.cmd("scancel").arg(&job).status().unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    while srun.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "srun still running");
        std::thread::sleep(Duration::from_millis(200));
    }
    c.nothing_left();
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
