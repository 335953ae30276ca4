//! The report's figures: the existing shared-storage series (field names kept), then the
//! node-local storage case (`node_local` in JSON) and the evacuation section.

use super::{Evacuation, MigrateReport, RawRecord, VseRecord};
use crate::stats::mean;
use serde_json::{Value, json};
use std::fmt;
use std::time::Duration;

/// The report's series and means.
struct Figures {
    raw_qemu: Vec<f64>,
    raw_wall: Vec<f64>,
    downtime: Vec<f64>,
    full_total: Vec<f64>,
    full_qemu: Vec<f64>,
}

impl MigrateReport {
    fn figures(&self) -> Figures {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Figures {
            raw_qemu: self
                .raw
                .iter()
                .map(|r| r.report.total_time_ms as f64)
                .collect(),
            raw_wall: self.raw.iter().map(|r| r.wall_ms as f64).collect(),
            downtime: self
                .raw
                .iter()
                .map(|r| r.report.downtime_ms as f64)
                .collect(),
            full_total: self.full.iter().map(|(d, _)| ms(*d)).collect(),
            full_qemu: self
                .full
                .iter()
                .map(|(_, r)| r.report.total_time_ms as f64)
                .collect(),
        }
    }

    pub fn json(&self) -> Value {
        let f = self.figures();
        let mut doc = json!({
            "accelerator": self.accel.accel.as_str(),
            "accelerator_reason": self.accel.reason,
            "guest_memory_mib": self.memory,
            "rounds": self.rounds,
            "raw": {
                "qemu_total_ms": f.raw_qemu,
                "qemu_downtime_ms": f.downtime,
                "prepare_to_running_ms": f.raw_wall,
            },
            "prediction_to_completion": {
                "total_ms": f.full_total,
                "qemu_total_ms": f.full_qemu,
            },
            "mean": {
                "raw_qemu_ms": mean(&f.raw_qemu),
                "raw_prepare_to_running_ms": mean(&f.raw_wall),
                "prediction_to_completion_ms": mean(&f.full_total),
                "protocol_overhead_ms": mean(&f.full_total) - mean(&f.full_qemu),
            },
        });
        doc["node_local"] = self.node_local_json();
        doc["evacuate_mpi"] = self.evacuation.json();
        doc
    }

    fn node_local_json(&self) -> Value {
        json!({
            "disk_mib": self.disk_mib,
            "disk_data_mib": self.disk_data_mib,
            "raw_qmp_shared": self.raw_shared,
            "raw_qmp_drive_mirror": self.raw_copy,
            "vse_block_copy": self.vse_copy.tls,
            "vse_block_copy_plain": self.vse_copy.plain,
            "mean": {
                "raw_qmp_shared": raw_means(&self.raw_shared),
                "raw_qmp_drive_mirror": raw_means(&self.raw_copy),
                "vse_block_copy": vse_means(&self.vse_copy.tls),
                "vse_block_copy_plain": vse_means(&self.vse_copy.plain),
            },
        })
    }
}

fn avg<T>(v: &[T], f: impl Fn(&T) -> u64) -> f64 {
    mean(&v.iter().map(|x| f(x) as f64).collect::<Vec<_>>())
}

fn raw_means(v: &[RawRecord]) -> Value {
    json!({
        "total_ms": avg(v, |r| r.total_ms),
        "send_ms": avg(v, |r| r.send_ms),
        "downtime_ms": avg(v, |r| r.downtime_ms),
        "resume_ms": avg(v, |r| r.resume_ms),
        "disk_bytes": avg(v, |r| r.disk_bytes),
        "memory_bytes": avg(v, |r| r.memory_bytes),
    })
}

fn vse_means(v: &[VseRecord]) -> Value {
    json!({
        "total_ms": avg(v, |r| r.total_ms),
        "send_ms": avg(v, |r| r.send_ms),
        "downtime_ms": avg(v, |r| r.downtime_ms),
        "disk_bytes": avg(v, |r| r.disk_bytes),
        "memory_bytes": avg(v, |r| r.memory_bytes),
    })
}

const MIB: f64 = 1048576.0;

/// The node-local lines of the text report.
fn node_local_text(r: &MigrateReport, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(
        f,
        "guest with a {} MiB disk, {} MiB written (each node its own image copy):",
        r.disk_mib, r.disk_data_mib
    )?;
    let raw = |f: &mut fmt::Formatter<'_>, what: &str, v: &[RawRecord]| {
        writeln!(
            f,
            "  {what}: {:.0} ms start to running (send {:.0} ms), QEMU downtime {:.0} ms \
             + {:.0} ms to resume; disk {:.1} MiB, memory {:.1} MiB",
            avg(v, |x| x.total_ms),
            avg(v, |x| x.send_ms),
            avg(v, |x| x.downtime_ms),
            avg(v, |x| x.resume_ms),
            avg(v, |x| x.disk_bytes) / MIB,
            avg(v, |x| x.memory_bytes) / MIB
        )
    };
    raw(f, "raw QEMU by hand, shared overlay", &r.raw_shared)?;
    raw(f, "raw QEMU by hand, drive-mirror to NBD", &r.raw_copy)?;
    let vse = |f: &mut fmt::Formatter<'_>, what: &str, v: &[VseRecord]| {
        writeln!(
            f,
            "  {what}: {:.0} ms prepare to running (send {:.0} ms), QEMU downtime {:.0} ms; \
             disk {:.1} MiB, memory {:.1} MiB",
            avg(v, |x| x.total_ms),
            avg(v, |x| x.send_ms),
            avg(v, |x| x.downtime_ms),
            avg(v, |x| x.disk_bytes) / MIB,
            avg(v, |x| x.memory_bytes) / MIB
        )
    };
    vse(f, "vse block copy (TLS-PSK)", &r.vse_copy.tls)?;
    vse(
        f,
        "vse block copy, no TLS (like for like with drive-mirror)",
        &r.vse_copy.plain,
    )
}

fn evacuation_text(e: &Evacuation, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match e {
        Evacuation::Skipped(why) => writeln!(f, "vse evacuate of an MPI job: skipped: {why}"),
        Evacuation::Measured {
            node,
            evacuate_ms,
            migration,
            request,
            ..
        } => {
            let p = super::evacuate::phases(request, migration);
            writeln!(
                f,
                "vse evacuate {node} --wait of an MPI job: {evacuate_ms} ms (request → plan {} ms, plan → notice {} ms, ranks to their barrier {} ms, barrier → done {} ms against QEMU's {} ms: {}x); transfer {}",
                p["request_to_plan_ms"],
                p["plan_to_notice_ms"],
                p["barrier_wait_ms"],
                p["after_barrier_ms"],
                p["qemu_total_ms"],
                p["after_barrier_vs_qemu"]
                    .as_f64()
                    .map_or("?".into(), |r| format!("{r:.2}")),
                migration
                    .pointer("/moves/0/transfer")
                    .unwrap_or(&Value::Null)
            )
        }
    }
}

impl fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.figures();
        writeln!(
            f,
            "{} MiB guest, {} ({}), {} round(s) each",
            self.memory,
            self.accel.accel.as_str(),
            self.accel.reason,
            self.rounds
        )?;
        writeln!(
            f,
            "raw QEMU live migration: {:.0} ms mean (downtime {:.0} ms); with destination \
             start and switch-over {:.0} ms",
            mean(&g.raw_qemu),
            mean(&g.downtime),
            mean(&g.raw_wall)
        )?;
        writeln!(
            f,
            "prediction → completed barrier-coordinated migration: {:.0} ms mean \
             (QEMU part {:.0} ms, protocol + destination start {:.0} ms)",
            mean(&g.full_total),
            mean(&g.full_qemu),
            mean(&g.full_total) - mean(&g.full_qemu)
        )?;
        node_local_text(self, f)?;
        evacuation_text(&self.evacuation, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::VseMoves;
    use v2m::qemu::{Accel, AccelChoice};

    fn report() -> MigrateReport {
        let raw = |storage, disk| RawRecord {
            storage,
            total_ms: 600,
            send_ms: 500,
            qemu_total_ms: 100,
            downtime_ms: 10,
            resume_ms: 5,
            disk_bytes: disk,
            memory_bytes: 1 << 20,
        };
        MigrateReport {
            accel: AccelChoice {
                accel: Accel::Tcg,
                reason: "test".into(),
                detail: String::new(),
            },
            memory: 256,
            rounds: 1,
            raw: vec![],
            full: vec![],
            disk_mib: 256,
            disk_data_mib: 64,
            raw_shared: vec![raw("shared", 0)],
            raw_copy: vec![raw("block-copy", 64 << 20)],
            vse_copy: VseMoves {
                tls: vec![VseRecord {
                    storage: "block-copy".into(),
                    total_ms: 1700,
                    send_ms: 1400,
                    downtime_ms: 90,
                    disk_bytes: 64 << 20,
                    memory_bytes: 1 << 20,
                }],
                plain: vec![VseRecord {
                    storage: "block-copy".into(),
                    total_ms: 800,
                    send_ms: 600,
                    downtime_ms: 70,
                    disk_bytes: 64 << 20,
                    memory_bytes: 1 << 20,
                }],
            },
            evacuation: Evacuation::Skipped("no --mpi-image DIR".into()),
        }
    }

    /// Scripts compare runs over time: the fields of earlier versions stay where they were.
    #[test]
    fn earlier_fields_stay_and_the_node_local_case_is_added() {
        let j = report().json();
        for p in [
            "/accelerator",
            "/guest_memory_mib",
            "/raw/qemu_total_ms",
            "/raw/qemu_downtime_ms",
            "/raw/prepare_to_running_ms",
            "/prediction_to_completion/total_ms",
            "/mean/protocol_overhead_ms",
        ] {
            assert!(j.pointer(p).is_some(), "{p} missing in {j}");
        }
        let nl = &j["node_local"];
        assert_eq!(nl["raw_qmp_drive_mirror"][0]["disk_bytes"], 64 << 20);
        assert_eq!(nl["mean"]["vse_block_copy"]["total_ms"], 1700.0);
        assert_eq!(nl["mean"]["vse_block_copy_plain"]["total_ms"], 800.0);
        assert_eq!(nl["mean"]["raw_qmp_shared"]["resume_ms"], 5.0);
        assert_eq!(j["evacuate_mpi"]["skipped"], "no --mpi-image DIR");
    }

    #[test]
    fn the_text_says_why_a_section_was_skipped() {
        let t = report().to_string();
        assert!(t.contains("drive-mirror to NBD: 600 ms"), "{t}");
        assert!(t.contains("vse block copy (TLS-PSK): 1700 ms"), "{t}");
        assert!(
            t.contains("no TLS (like for like with drive-mirror): 800 ms"),
            "{t}"
        );
        assert!(t.contains("skipped: no --mpi-image DIR"), "{t}");
    }
}
