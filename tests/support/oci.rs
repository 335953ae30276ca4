//! Container-image fixtures for the `vse import` tests, made locally with the real tools
//! (no registry is reachable): a Debian rootfs from `mmdebstrap`, made into an OCI image with
//! `umoci`, copied into an OCI archive and a `docker save` archive with `skopeo`. Built once
//! into VSE_CACHE under a lock, in a temporary directory renamed into place when complete.

use super::vm::lock;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the recipe changes.
const VERSION: &str = "v1";
/// The tag of the image in the layout.
pub const TAG: &str = "deb";

pub struct DebianOci {
    /// OCI image layout directory (tag [`TAG`]).
    pub layout: PathBuf,
    /// `skopeo copy oci:… oci-archive:…`.
    pub oci_archive: PathBuf,
    /// `skopeo copy oci:… docker-archive:…:vse/deb:test`.
    pub docker_archive: PathBuf,
}

fn run(dir: &Path, cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Debian bookworm image (`essential` variant: dpkg, coreutils, dash, perl-base with its
/// hard links, device nodes in /dev), or `None` when a tool is missing (skip-or-fail).
pub fn debian_oci() -> Option<DebianOci> {
    if !["mmdebstrap", "umoci", "skopeo"]
        .iter()
        .all(|t| testkit::tool(t))
    {
        return None;
    }
    let shared = std::env::var_os("VSE_CACHE").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&shared).unwrap();
    let _lock = lock(&shared.join(format!("vse-test-oci-{VERSION}.lock")));
    let dir = shared.join(format!("vse-test-oci-{VERSION}"));
    let fixture = DebianOci {
        layout: dir.join("oci"),
        oci_archive: dir.join("deb.oci.tar"),
        docker_archive: dir.join("deb.docker.tar"),
    };
    if dir.is_dir() {
        return Some(fixture);
    }
    let tmp = tempfile::Builder::new()
        .prefix(".vse-test-oci-")
        .tempdir_in(&shared)
        .unwrap();
    let t = tmp.path();
    let mut mm: Vec<String> = vec!["--variant=essential".into(), "--quiet".into()];
    for d in ["doc", "man", "locale", "info"] {
        mm.push(format!("--dpkgopt=path-exclude=/usr/share/{d}/*"));
    }
    mm.extend(["bookworm".into(), "rootfs.tar".into()]);
    run(
        t,
        "mmdebstrap",
        &mm.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    run(t, "umoci", &["init", "--layout", "oci"]);
    run(t, "umoci", &["new", "--image", "oci:deb"]);
    run(
        t,
        "umoci",
        &["raw", "add-layer", "--image", "oci:deb", "rootfs.tar"],
    );
    run(
        t,
        "umoci",
        &[
            "config",
            "--image",
            "oci:deb",
            "--config.cmd",
            "/bin/sh",
            "--created",
            "2025-05-20T00:00:00Z",
        ],
    );
    run(t, "umoci", &["gc", "--layout", "oci"]);
    let copy = |to: &str| {
        run(
            t,
            "skopeo",
            &["--insecure-policy", "copy", "-q", "oci:oci:deb", to],
        )
    };
    copy("oci-archive:deb.oci.tar");
    copy("docker-archive:deb.docker.tar:vse/deb:test");
    std::fs::remove_file(t.join("rootfs.tar")).unwrap();
    std::fs::rename(tmp.keep(), &dir).unwrap();
    Some(fixture)
}
