//! Shares: the same file work inside one VM through a share (FUSE over the agent channel, see
//! ARCHITECTURE.md) and on the VM's own root disk, and on the host directly: a sequential
//! write (with fsync) and a cold sequential read of one large file, and the creation of many
//! small files. The guest runs the script through `vse run` (the `vse` under test), as the
//! calling user; the host runs the very same script in the shared directory. Goals: large-file
//! throughput through the share at least the root disk's; small files at least half its rate.

use crate::{BenchError, Step};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, Args)]
pub struct ShareBench {
    /// Image to boot (default: the tests' minimal image in $VSE_CACHE).
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Size of the large file, MiB.
    #[arg(long, default_value_t = 256)]
    pub mib: u64,
    /// Small files to create.
    #[arg(long, default_value_t = 5000)]
    pub files: u32,
    #[arg(long)]
    pub json: bool,
}

/// One place's figures.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Place {
    pub write_mib_s: f64,
    pub read_mib_s: f64,
    pub files_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShareReport {
    pub image: PathBuf,
    pub mib: u64,
    pub files: u32,
    /// Through the share, in the VM.
    pub share: Place,
    /// The VM's own root disk (its qcow2 overlay).
    pub vm_disk: Place,
    /// The host, in the shared directory, without a VM.
    pub host: Place,
    /// Share ÷ VM disk (goal ≥ 1 for write and read, ≥ 0.5 for files).
    pub share_vs_disk: Place,
    /// Whether the guest dropped its page cache before the reads (it needs root in the guest).
    pub cold_reads: bool,
}

/// The work, in `$1`; prints `write NS`, `read NS`, `files NS`. The read's file is written
/// by the host beforehand (`in.bin`), so no page cache of the reader holds it.
const SCRIPT: &str = r#"set -e
d=$1; mib=$2; n=$3
t() { date +%s%N; }
a=$(t); dd if=/dev/zero of="$d/out.bin" bs=1M count="$mib" conv=fsync status=none; b=$(t)
echo "write $((b-a))"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo cold || true
a=$(t); cat "$d/in.bin" > /dev/null; b=$(t)
echo "read $((b-a))"
mkdir "$d/small"; cd "$d/small"
a=$(t); i=0; while [ $i -lt "$n" ]; do : > "f$i"; i=$((i+1)); done; b=$(t)
echo "files $((b-a))"
"#;

pub fn run(a: &ShareBench, vse: &Path, step: Step) -> Result<ShareReport, BenchError> {
    let image = a
        .image
        .clone()
        .or_else(crate::latency::default_image)
        .ok_or_else(|| BenchError::Failed("no image: pass --image DIR".into()))?;
    let tmp = tempfile::Builder::new()
        .prefix("vse-bench-share-")
        .tempdir_in(vse_base::cache_root())?;
    let (host_dir, shared) = (tmp.path().join("host"), tmp.path().join("shared"));
    for d in [&host_dir, &shared] {
        std::fs::create_dir(d)?;
        write_input(&d.join("in.bin"), a.mib)?;
    }
    step("the host");
    let host = rates(&sh(&host_dir, a)?, a);
    step("in a VM: through the share, then on its own disk");
    let script = format!(
        "{} /share {m} {n} | sed 's/^/share /'; mkdir -p $HOME/disk; head -c {}M /dev/zero > $HOME/disk/in.bin; {} $HOME/disk {m} {n} | sed 's/^/disk /'",
        quoted(SCRIPT),
        a.mib,
        quoted(SCRIPT),
        m = a.mib,
        n = a.files,
    );
    let out = Command::new(vse)
        .arg("run")
        .arg(&image)
        .args(["--memory", "1024", "--no-default-shares", "--share"])
        .arg(format!("{}:/share", shared.display()))
        .args(["--", "bash", "-c", &script])
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "vse run: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let pick = |prefix: &str| -> BTreeMap<String, u64> {
        (text.lines())
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|l| {
                let (k, v) = l.trim().split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    };
    let (share, vm_disk) = (pick("share "), pick("disk "));
    let (share, vm_disk) = (rates(&share, a), rates(&vm_disk, a));
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    Ok(ShareReport {
        image,
        mib: a.mib,
        files: a.files,
        share_vs_disk: Place {
            write_mib_s: ratio(share.write_mib_s, vm_disk.write_mib_s),
            read_mib_s: ratio(share.read_mib_s, vm_disk.read_mib_s),
            files_per_s: ratio(share.files_per_s, vm_disk.files_per_s),
        },
        cold_reads: text.contains("share cold"),
        share,
        vm_disk,
        host,
    })
}

/// Nanoseconds by step, as rates.
fn rates(h: &BTreeMap<String, u64>, a: &ShareBench) -> Place {
    Place {
        write_mib_s: per_s(a.mib as f64, h.get("write")),
        read_mib_s: per_s(a.mib as f64, h.get("read")),
        files_per_s: per_s(f64::from(a.files), h.get("files")),
    }
}

fn per_s(amount: f64, ns: Option<&u64>) -> f64 {
    match ns {
        Some(&ns) if ns > 0 => amount / (ns as f64 / 1e9),
        _ => 0.0,
    }
}

/// The script as one shell word.
fn quoted(script: &str) -> String {
    format!("bash -c '{}' bench", script.replace('\'', r"'\''"))
}

fn write_input(path: &Path, mib: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for _ in 0..mib {
        f.write_all(&block)?;
    }
    f.into_inner()?.sync_all()
}

/// Runs the script on the host in `dir`: nanoseconds by step.
fn sh(dir: &Path, a: &ShareBench) -> Result<BTreeMap<String, u64>, BenchError> {
    let out = Command::new("bash")
        .args(["-c", SCRIPT, "bench"])
        .arg(dir)
        .arg(a.mib.to_string())
        .arg(a.files.to_string())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok((text.lines())
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

impl std::fmt::Display for ShareReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "shares: {} MiB file, {} small files ({})",
            self.mib,
            self.files,
            self.image.display()
        )?;
        writeln!(
            f,
            "  {:<10} {:>12} {:>12} {:>12}",
            "", "write MiB/s", "read MiB/s", "files/s"
        )?;
        for (name, p) in [
            ("share", &self.share),
            ("VM disk", &self.vm_disk),
            ("host", &self.host),
        ] {
            writeln!(
                f,
                "  {name:<10} {:>12.1} {:>12.1} {:>12.0}",
                p.write_mib_s, p.read_mib_s, p.files_per_s
            )?;
        }
        let r = &self.share_vs_disk;
        writeln!(
            f,
            "  share ÷ VM disk: write {:.2}x (goal ≥ 1), read {:.2}x (goal ≥ 1), files {:.2}x (goal ≥ 0.5); reads {}",
            r.write_mib_s,
            r.read_mib_s,
            r.files_per_s,
            if self.cold_reads {
                "cold"
            } else {
                "possibly cached (not root in the guest)"
            }
        )
    }
}
