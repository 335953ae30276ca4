//! Compiles the MPI_Barrier hook (`preload/vse_barrier_mpi.c`) into the shared library the
//! agent carries and writes into the guest at boot (see `src/preload.rs`). Plain `cc`, no
//! MPI: the library must load into whatever MPI the guest has.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=preload/vse_barrier_mpi.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let lib = out.join("libvse-barrier-mpi.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-s",
        ])
        .args(["-Wl,-z,noexecstack", "-Wl,--build-id=none"])
        .arg("preload/vse_barrier_mpi.c")
        .arg("-o")
        .arg(&lib)
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "compiling preload/vse_barrier_mpi.c with `{cc}` failed ({other:?}); the guest agent \
             needs a C compiler (apt-get install gcc)"
        ),
    }
}
