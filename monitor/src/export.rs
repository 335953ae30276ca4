//! Exporters so sites can feed their existing dashboards: JSON lines (for hooks), Prometheus
//! text exposition format 0.0.4, and LDMS `store_csv`-style CSV.

use super::{MonitorError, NodeSample, Sample, VmSample};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

/// One sample as a JSON line (newline included).
pub fn json_line(sample: &Sample) -> String {
    // Serialising plain structs of numbers and validated strings cannot fail.
    let mut s = serde_json::to_string(sample).unwrap_or_default();
    s.push('\n');
    s
}

struct Family {
    help: &'static str,
    kind: &'static str,
    lines: Vec<String>,
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Renders a batch of samples in the Prometheus text format. Metrics of one family are
/// grouped as the format requires; the latest sample of each series wins.
pub fn prometheus_text(samples: &[Sample]) -> String {
    let mut fams: BTreeMap<&'static str, Family> = BTreeMap::new();
    let mut add = |name: &'static str, help, kind, lbl: String, v: f64, ts: u64| {
        fams.entry(name)
            .or_insert_with(|| Family {
                help,
                kind,
                lines: Vec::new(),
            })
            .lines
            .push(format!("{name}{lbl} {v} {ts}"));
    };
    for s in samples {
        match s {
            Sample::Node(n) => {
                let job = n.job.as_ref().map(|j| j.as_str()).unwrap_or("");
                let l = labels(&[("job", job), ("node", n.node.as_str())]);
                let kib = |k: u64| (k * 1024) as f64;
                add(
                    "vse_node_mem_total_bytes",
                    "MemTotal of the node",
                    "gauge",
                    l.clone(),
                    kib(n.mem.total_kib),
                    n.ts_ms,
                );
                add(
                    "vse_node_mem_active_bytes",
                    "Active memory of the node",
                    "gauge",
                    l.clone(),
                    kib(n.mem.active_kib),
                    n.ts_ms,
                );
                add(
                    "vse_node_mem_available_bytes",
                    "MemAvailable of the node",
                    "gauge",
                    l,
                    kib(n.mem.available_kib),
                    n.ts_ms,
                );
                for (i, u) in n.cpu.iter().enumerate() {
                    let l = labels(&[
                        ("job", job),
                        ("node", n.node.as_str()),
                        ("cpu", &i.to_string()),
                    ]);
                    add(
                        "vse_node_cpu_busy_ratio",
                        "Busy fraction of a core over the last period",
                        "gauge",
                        l,
                        *u,
                        n.ts_ms,
                    );
                }
            }
            Sample::Vm(v) => {
                let job = v.job.as_ref().map(|j| j.as_str()).unwrap_or("");
                let l = labels(&[
                    ("job", job),
                    ("node", v.node.as_str()),
                    ("vm", v.vm.as_str()),
                ]);
                if let Some(h) = &v.host {
                    add(
                        "vse_vm_host_rss_bytes",
                        "RSS of the hypervisor process",
                        "gauge",
                        l.clone(),
                        (h.rss_kib * 1024) as f64,
                        v.ts_ms,
                    );
                    add(
                        "vse_vm_host_cpu_seconds_total",
                        "CPU time of the hypervisor process, all threads",
                        "counter",
                        l.clone(),
                        h.cpu_seconds,
                        v.ts_ms,
                    );
                }
                if let Some(g) = &v.guest {
                    add(
                        "vse_vm_guest_mem_total_bytes",
                        "MemTotal seen by the guest",
                        "gauge",
                        l.clone(),
                        (g.mem.total_kib * 1024) as f64,
                        v.ts_ms,
                    );
                    add(
                        "vse_vm_guest_mem_active_bytes",
                        "Active memory seen by the guest",
                        "gauge",
                        l.clone(),
                        (g.mem.active_kib * 1024) as f64,
                        v.ts_ms,
                    );
                    add(
                        "vse_vm_guest_mem_available_bytes",
                        "MemAvailable seen by the guest",
                        "gauge",
                        l,
                        (g.mem.available_kib * 1024) as f64,
                        v.ts_ms,
                    );
                }
            }
        }
    }
    let mut out = String::new();
    for (name, f) in fams {
        let _ = writeln!(out, "# HELP {name} {}", f.help);
        let _ = writeln!(out, "# TYPE {name} {}", f.kind);
        for l in f.lines {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// Which LDMS-style schema a CSV file carries: one file per schema, as `store_csv` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LdmsSchema {
    /// Node meminfo plus this many per-core utilisation columns.
    Node {
        cores: usize,
    },
    Vm,
}

/// LDMS `store_csv`-style writer: `#Time,Time_usec,ProducerName,component_id,job_id,...`.
pub struct LdmsCsv<W: Write> {
    out: W,
    schema: LdmsSchema,
}

impl<W: Write> LdmsCsv<W> {
    /// Writes the header line at once so an empty file is still self-describing.
    pub fn new(mut out: W, schema: LdmsSchema) -> Result<Self, MonitorError> {
        let mut h = String::from("#Time,Time_usec,ProducerName,component_id,job_id");
        match schema {
            LdmsSchema::Node { cores } => {
                h.push_str(",MemTotal,Active,MemAvailable");
                for i in 0..cores {
                    let _ = write!(h, ",cpu{i}_busy");
                }
            }
            LdmsSchema::Vm => h.push_str(
                ",host_rss_kB,host_cpu_seconds,guest_MemTotal,guest_Active,guest_MemAvailable",
            ),
        }
        writeln!(out, "{h}")?;
        Ok(Self { out, schema })
    }

    fn prefix(ts_ms: u64, producer: &str, component: &str, job: &str) -> String {
        format!(
            "{}.{:03},{},{producer},{component},{job}",
            ts_ms / 1000,
            ts_ms % 1000,
            (ts_ms % 1000) * 1000
        )
    }

    pub fn write_node(&mut self, n: &NodeSample) -> Result<(), MonitorError> {
        let LdmsSchema::Node { cores } = self.schema else {
            return Err(MonitorError::CsvShape {
                schema: "vm",
                expected: 0,
                got: n.cpu.len(),
            });
        };
        // The first sample has no delta yet: write empty cells rather than a fake 0.
        if !n.cpu.is_empty() && n.cpu.len() != cores {
            return Err(MonitorError::CsvShape {
                schema: "node",
                expected: cores,
                got: n.cpu.len(),
            });
        }
        let job = n.job.as_ref().map(|j| j.as_str()).unwrap_or("0");
        let mut line = Self::prefix(n.ts_ms, n.node.as_str(), n.node.as_str(), job);
        let _ = write!(
            line,
            ",{},{},{}",
            n.mem.total_kib, n.mem.active_kib, n.mem.available_kib
        );
        for i in 0..cores {
            match n.cpu.get(i) {
                Some(u) => {
                    let _ = write!(line, ",{u:.4}");
                }
                None => line.push(','),
            }
        }
        writeln!(self.out, "{line}")?;
        Ok(())
    }

    pub fn write_vm(&mut self, v: &VmSample) -> Result<(), MonitorError> {
        if self.schema != LdmsSchema::Vm {
            return Err(MonitorError::CsvShape {
                schema: "node",
                expected: 0,
                got: 0,
            });
        }
        let job = v.job.as_ref().map(|j| j.as_str()).unwrap_or("0");
        let mut line = Self::prefix(v.ts_ms, v.node.as_str(), v.vm.as_str(), job);
        match &v.host {
            Some(h) => {
                let _ = write!(line, ",{},{:.2}", h.rss_kib, h.cpu_seconds);
            }
            None => line.push_str(",,"),
        }
        match &v.guest {
            Some(g) => {
                let _ = write!(
                    line,
                    ",{},{},{}",
                    g.mem.total_kib, g.mem.active_kib, g.mem.available_kib
                );
            }
            None => line.push_str(",,,"),
        }
        writeln!(self.out, "{line}")?;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}
