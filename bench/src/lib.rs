//! The figures of `vse bench …`: speed and memory measured on the real components, printed
//! (never asserted in tests). Each area is a module with its options (a clap argument group
//! the CLI flattens in), a `run` that measures and returns a report, and the report's text
//! (`Display`) and JSON forms. Benchmarks that time whole `vse` processes take the path of
//! the `vse` binary to run.
//!
//! - [`resolve`]: parse + resolve against the full Debian index next to `apt-get install -s`,
//!   and `vse lock` as a whole process (cold / warm index cache) with its peak memory.
//! - [`build`]: image builds (full, warm layer, no-op, one package added, one file changed)
//!   next to mmdebstrap, boot overhead against plain QEMU, the image store's hit.
//! - [`vm`]: V2M boot, pause/resume, live migration and checkpoint/restore.
//! - [`launch`]: agent bootstrap at scale (split across worker processes: [`bootstrap`]), image staging next to Slurm's `sbcast`, failure
//!   detection.
//! - [`stage`]: image staging (holes skipped, zstd on the wire) next to `sbcast`,
//!   `sbcast --compress` and the `dd` limit, for the real minimal image and an incompressible one.
//! - [`monitor`]: sampler cost, controller ingest, rule evaluation, trigger latency.
//! - [`migrate`]: prediction to completed barrier-coordinated migration next to raw QEMU.

pub mod bootstrap;
pub mod build;
mod checkpoint;
mod error;
mod fixtures;
mod latency;
pub mod launch;
mod measure;
pub mod migrate;
pub mod monitor;
pub mod resolve;
mod sbcast;
pub mod share;
pub mod stage;
pub mod stats;
pub mod vm;

pub use error::BenchError;

/// Where a benchmark reports the step it is on (a spinner's message, a log line).
pub type Step<'a> = &'a dyn Fn(&str);
