//! Compiles the memory hog (`src/bin/vse-test-hog.rs`, std only) into OUT_DIR and hands its
//! path to the library as `VSE_TEST_HOG_BIN`. Cargo builds a package's binaries for its own
//! tests only, never for the tests of crates that depend on it, so the crates whose tests
//! need the hog could not find a `[[bin]]` of this one.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/bin/vse-test-hog.rs";
    println!("cargo:rerun-if-changed={src}");
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("vse-test-hog");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--edition=2024",
        "-O",
        "--crate-type=bin",
        "--crate-name=vse_test_hog",
    ]);
    if let Ok(target) = std::env::var("TARGET") {
        cmd.args(["--target", &target]);
    }
    let status = cmd.arg(src).arg("-o").arg(&out).status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!("compiling {src} with rustc failed: {other:?}"),
    }
    println!("cargo:rustc-env=VSE_TEST_HOG_BIN={}", out.display());
}
