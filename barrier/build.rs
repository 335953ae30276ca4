//! Builds the MPI_Barrier PMPI wrapper (`libvse_barrier_mpi.a`) when an MPI compiler wrapper
//! is installed (`mpicc`, or the one named by `VSE_MPICC`). Without MPI the crate still
//! builds: the plain barrier-hook API needs none.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=c/mpi_barrier.c");
    println!("cargo:rerun-if-changed=include/vse_barrier.h");
    println!("cargo:rerun-if-env-changed=VSE_MPICC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mpicc = std::env::var("VSE_MPICC").unwrap_or_else(|_| "mpicc".into());
    let obj = out.join("mpi_barrier.o");
    let lib = out.join("libvse_barrier_mpi.a");
    let built = Command::new(&mpicc)
        .args([
            "-O2",
            "-fPIC",
            "-Wall",
            "-Werror",
            "-Iinclude",
            "-c",
            "c/mpi_barrier.c",
            "-o",
        ])
        .arg(&obj)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("ar")
            .arg("rcs")
            .arg(&lib)
            .arg(&obj)
            .status()
            .is_ok_and(|s| s.success());
    let path = if built {
        lib.display().to_string()
    } else {
        String::new()
    };
    println!("cargo:rustc-env=VSE_BARRIER_MPI_LIB={path}");
    println!("cargo:rustc-env=VSE_BARRIER_MPICC={mpicc}");
}
