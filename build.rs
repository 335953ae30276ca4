//! Builds the static guest agent that every image carries and hands it to the `vse` binary,
//! which embeds it: an installed `vse` (`cargo install --path .`) is then complete, with no
//! second binary to find. The agent is a separate static build (glibc's static libraries,
//! `crt-static`) so it runs inside any distribution's image; `--target` keeps that flag off
//! build scripts and proc-macros, which cannot be static.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for p in ["guest-agent/src", "guest-agent/Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=VSE_AGENT_PREBUILT");
    let dest = out.join("vse-guest-agent");
    // Packagers who build the agent themselves (or a cross build) point here instead.
    if let Some(pre) = std::env::var_os("VSE_AGENT_PREBUILT") {
        copy(Path::new(&pre), &dest);
        return;
    }
    // One agent build for every profile of `vse` (debug, release, clippy): a sibling of the
    // profile directories, so they do not each rebuild it.
    let agent_target = target_root(&out).join("vse-guest-agent");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "--release", "--locked", "--offline"])
        .args(["-p", "vse-guest-agent", "--bin", "vse-guest-agent"])
        .args(["--target", TARGET])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&agent_target)
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        // Smaller images; the same settings as .ci/static-build.sh, so the builds are shared.
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    // What the outer build passes to build scripts must not leak into this one (a clippy run
    // would lint the agent again; the outer RUSTFLAGS would undo the static link).
    for var in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CLIPPY_ARGS",
        "CLIPPY_CONF_DIR",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("running cargo for the guest agent");
    assert!(
        status.success(),
        "building the static guest agent failed ({status}); it needs glibc's static libraries \
         (apt-get install libc6-dev)"
    );
    copy(
        &agent_target
            .join(TARGET)
            .join("release")
            .join("vse-guest-agent"),
        &dest,
    );
}

/// `<target>/<profile>/build/<pkg>-<hash>/out` → `<target>`.
fn target_root(out: &Path) -> PathBuf {
    out.ancestors()
        .nth(4)
        .map_or_else(|| out.join("agent"), Path::to_path_buf)
}

fn copy(from: &Path, to: &Path) {
    if let Err(e) = std::fs::copy(from, to) {
        panic!(
            "copying the guest agent {} → {}: {e}",
            from.display(),
            to.display()
        );
    }
}
