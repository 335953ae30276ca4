//! The text form of `vse bench vm`.

use super::Report;
use crate::stats::median;
use std::fmt;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        writeln!(f, "accelerator: {}", r.accelerator)?;
        writeln!(
            f,
            "boot to ready: plugin median {} ms {:?}, plain QEMU median {} ms {:?}",
            median(&r.boot_plugin_ms).unwrap_or(0),
            r.boot_plugin_ms,
            median(&r.boot_plain_qemu_ms).unwrap_or(0),
            r.boot_plain_qemu_ms
        )?;
        writeln!(
            f,
            "pause latency median {:.2} ms, resume latency median {:.2} ms ({} samples)",
            median(&r.pause_ms).unwrap_or(0.0),
            median(&r.resume_ms).unwrap_or(0.0),
            r.pause_ms.len()
        )?;
        writeln!(
            f,
            "live migration at {} MiB/s, downtime limit 300 ms:",
            r.bandwidth_mib
        )?;
        for m in &r.migrations {
            writeln!(
                f,
                "  {:<11} total {:>6} ms  downtime {:>4} ms  transferred {:>7.1} MiB  bound (bytes/bandwidth) {:>6} ms",
                m.case, m.total_ms, m.downtime_ms, m.transferred_mib, m.bound_ms
            )?;
        }
        if let Some(c) = &r.checkpoint {
            writeln!(
                f,
                "checkpoint {} MiB guest: {:.0} MiB file in {} ms ({:.0} MiB/s); restore {} ms ({:.0} MiB/s)",
                c.guest_mib,
                c.file_mib,
                c.checkpoint_ms,
                c.checkpoint_mib_s,
                c.restore_ms,
                c.restore_mib_s
            )?;
        }
        Ok(())
    }
}
