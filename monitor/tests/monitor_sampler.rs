//! The sampler on this machine's real /proc and on a real child process; exporters and the
//! JSON-lines hook with a real external command.

use monitor::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::process::KillOnDrop;

fn node() -> NodeName {
    NodeName::new("n1").unwrap()
}

#[test]
fn node_sample_from_real_proc() {
    let mut s = Sampler::new(SamplerConfig::new(node()));
    let first = s.sample_node().unwrap();
    assert!(first.mem.total_kib > 0);
    assert!(first.mem.active_kib <= first.mem.total_kib);
    assert!(first.mem.available_kib <= first.mem.total_kib);
    assert!(first.cpu.is_empty(), "no delta on the first sample");
    // Burn CPU so the delta has something to show.
    let until = Instant::now() + Duration::from_millis(300);
    let mut x = 0u64;
    while Instant::now() < until {
        x = x.wrapping_mul(31).wrapping_add(1);
    }
    std::hint::black_box(x);
    let second = s.sample_node().unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(second.cpu.len() >= cores, "{} < {cores}", second.cpu.len());
    assert!(second.cpu.iter().all(|u| (0.0..=1.0).contains(u)));
    assert!(
        second.cpu.iter().any(|u| *u > 0.2),
        "a busy core must show: {:?}",
        second.cpu
    );
}

#[test]
fn host_view_of_a_real_process() {
    testkit::require!(testkit::tool("perl"));
    // 64 MiB touched, then one second of busy loop, then sleep.
    let child = Command::new("perl")
        .args(["-e", r#"$x = "a" x (64*1024*1024); $t = time; 1 while time - $t < 30; print "ok\n"; sleep 60"#])
        .stdout(Stdio::null())
        .spawn()
        .expect("perl starts");
    let child = KillOnDrop(child);
    let vm = VmProcess {
        vm: VmId::new("vm0").unwrap(),
        pid: child.0.id(),
    };
    let mut s = Sampler::new(SamplerConfig::new(node()));
    // Wait until the allocation is done, so the next period is pure busy loop.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let f = s.sample_vm(&vm, &mut NoGuest);
        assert!(f.errors.is_empty(), "{:?}", f.errors);
        if f.host.as_ref().unwrap().rss_kib >= 64 * 1024 || Instant::now() > deadline {
            break f;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(1000));
    let second = s.sample_vm(&vm, &mut NoGuest);
    let h = second.host.expect("host view");
    assert!(h.rss_kib >= 64 * 1024, "rss {} KiB", h.rss_kib);
    let cores = h.cpu_cores.expect("delta on second sample");
    // The CPU is shared with other work, so only require that the busy loop registered.
    assert!(cores > 0.05, "busy loop should use CPU: {cores}");
    assert!(h.cpu_seconds > first.host.unwrap().cpu_seconds);
    assert!(second.guest.is_none());
    drop(child);
    // Once the process is gone the sample says so instead of failing the round.
    let gone = s.sample_vm(&vm, &mut NoGuest);
    assert!(gone.host.is_none());
    assert!(gone.errors[0].contains("host view"), "{:?}", gone.errors);
}

/// A guest source that ships real /proc text, like the guest agent does.
struct RealText;
impl GuestSource for RealText {
    fn guest_proc(&mut self, _vm: &VmId) -> Result<Option<GuestProc>, MonitorError> {
        Ok(Some(GuestProc {
            meminfo: std::fs::read_to_string("/proc/meminfo").unwrap(),
            stat: std::fs::read_to_string("/proc/stat").unwrap(),
        }))
    }
}

struct Garbage;
impl GuestSource for Garbage {
    fn guest_proc(&mut self, _vm: &VmId) -> Result<Option<GuestProc>, MonitorError> {
        Ok(Some(GuestProc {
            meminfo: "MemTotal: 1 kB\n".into(),
            stat: "cpu0 1 2 3 4\n".into(),
        }))
    }
}

#[test]
fn guest_view_parsed_and_bad_guest_reported() {
    let vm = VmProcess {
        vm: VmId::new("vm1").unwrap(),
        pid: std::process::id(),
    };
    let mut s = Sampler::new(SamplerConfig::new(node()));
    let a = s.sample_vm(&vm, &mut RealText);
    let g = a.guest.expect("guest view");
    assert!(g.mem.total_kib > 0 && g.cpu.is_empty());
    let b = s.sample_vm(&vm, &mut RealText);
    assert!(!b.guest.unwrap().cpu.is_empty());
    let c = s.sample_vm(&vm, &mut Garbage);
    assert!(c.guest.is_none() && c.host.is_some());
    assert!(
        c.errors[0].contains("guest vm1 /proc/meminfo") && c.errors[0].contains("Active"),
        "{:?}",
        c.errors
    );
}

fn batch() -> Vec<Sample> {
    let mut cfg = SamplerConfig::new(node());
    cfg.job = Some(JobId::new("job-7").unwrap());
    let mut s = Sampler::new(cfg);
    let vms = [VmProcess {
        vm: VmId::new("vm0").unwrap(),
        pid: std::process::id(),
    }];
    s.sample_all(&vms, &mut RealText).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.sample_all(&vms, &mut RealText).unwrap()
}

#[test]
fn prometheus_exposition_is_well_formed() {
    let text = prometheus_text(&batch());
    let mut declared = std::collections::HashSet::new();
    let mut seen_families = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap();
            assert!(
                declared.insert(name.to_string()),
                "family {name} declared twice"
            );
            seen_families.push(name.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, rest) = line.rsplit_once('}').expect("labels");
        let name = series.split('{').next().unwrap();
        assert_eq!(
            Some(&name.to_string()),
            seen_families.last(),
            "families must be contiguous"
        );
        let nums: Vec<&str> = rest.split_whitespace().collect();
        assert_eq!(nums.len(), 2, "{line}");
        nums[0].parse::<f64>().unwrap();
        nums[1].parse::<u64>().unwrap();
        assert!(
            series.contains("job=\"job-7\"") && series.contains("node=\"n1\""),
            "{line}"
        );
    }
    for f in [
        "vse_node_mem_active_bytes",
        "vse_node_cpu_busy_ratio",
        "vse_vm_host_rss_bytes",
        "vse_vm_guest_mem_active_bytes",
    ] {
        assert!(declared.contains(f), "missing {f}\n{text}");
    }
}

#[test]
fn ldms_csv_rows_match_header() {
    let b = batch();
    let Sample::Node(n) = &b[0] else { panic!() };
    let mut node_csv = LdmsCsv::new(Vec::new(), LdmsSchema::Node { cores: n.cpu.len() }).unwrap();
    node_csv.write_node(n).unwrap();
    let mut vm_csv = LdmsCsv::new(Vec::new(), LdmsSchema::Vm).unwrap();
    let Sample::Vm(v) = &b[1] else { panic!() };
    vm_csv.write_vm(v).unwrap();
    assert!(vm_csv.write_node(n).is_err());
    for out in [node_csv.into_inner(), vm_csv.into_inner()] {
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("#Time,Time_usec,ProducerName,component_id,job_id,"));
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0].split(',').count(),
            lines[1].split(',').count(),
            "{text}"
        );
        assert!(lines[1].split(',').nth(4) == Some("job-7"));
    }
    let mut wrong = LdmsCsv::new(
        Vec::new(),
        LdmsSchema::Node {
            cores: n.cpu.len() + 1,
        },
    )
    .unwrap();
    let e = wrong.write_node(n).unwrap_err().to_string();
    assert!(e.contains("CPU columns"), "{e}");
}

#[test]
fn json_lines_hook_receives_every_sample() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hook.jsonl");
    let script = format!("cat > '{}'", out.display());
    let mut hook = CommandHook::spawn("sh", &["-c".into(), script]).unwrap();
    let b = batch();
    hook.send(&b).unwrap();
    hook.send(&b).unwrap();
    let st = hook.finish(Duration::from_secs(5)).unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&out).unwrap();
    let back: Vec<Sample> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back.len(), 2 * b.len());
    // Floats may differ in the last digit after a JSON round trip; tags and integers may not.
    for (x, y) in back.iter().zip(b.iter().chain(b.iter())) {
        assert_eq!((x.node(), x.ts_ms()), (y.node(), y.ts_ms()));
        match (x, y) {
            (Sample::Node(x), Sample::Node(y)) => {
                assert_eq!((x.mem, x.cpu.len()), (y.mem, y.cpu.len()))
            }
            (Sample::Vm(x), Sample::Vm(y)) => {
                assert_eq!(x.vm, y.vm);
                assert_eq!(
                    x.host.as_ref().map(|h| h.rss_kib),
                    y.host.as_ref().map(|h| h.rss_kib)
                );
                assert_eq!(
                    x.guest.as_ref().map(|g| g.mem),
                    y.guest.as_ref().map(|g| g.mem)
                );
            }
            _ => panic!("sample kinds differ: {x:?} vs {y:?}"),
        }
    }
}

#[test]
fn hook_that_exits_is_reported() {
    let mut hook = CommandHook::spawn("sh", &["-c".into(), "exit 3".into()]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let one = batch();
    let big: Vec<Sample> = one.iter().cycle().take(20_000).cloned().collect();
    let e = hook.send(&big).unwrap_err().to_string();
    assert!(e.contains("exit status: 3"), "{e}");
    assert!(CommandHook::spawn("/nonexistent/hook", &[]).is_err());
}
