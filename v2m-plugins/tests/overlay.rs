//! Per-VM qcow2 overlays on one master image: all created or none (real qemu-img).

use std::path::Path;
use v2m::DiskFormat;
use v2m::overlay::{OverlayRequest, create_overlays};

fn qemu_img() -> Option<std::path::PathBuf> {
    let p = v2m::qemu::find_binary(Path::new("qemu-img"));
    testkit::require(p.is_some(), "qemu-img", "apt-get install qemu-utils");
    p
}

#[test]
fn hundreds_of_overlays_in_one_transaction() {
    let Some(img) = qemu_img() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("master.raw");
    std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
    let reqs: Vec<_> = (0..200)
        .map(|i| OverlayRequest {
            base: base.clone(),
            base_format: DiskFormat::Raw,
            path: dir.path().join(format!("vm{i}.qcow2")),
        })
        .collect();
    let made = create_overlays(&img, &reqs).unwrap();
    assert_eq!(made.len(), 200);
    // qemu-img itself must see the backing chain we claim.
    let out = std::process::Command::new(&img)
        .args(["info", "--output=json"])
        .arg(&made[199])
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["backing-filename"], base.to_str().unwrap());
    assert_eq!(info["virtual-size"], 1 << 20);
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".v2m-tmp-")
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn one_failure_creates_none() {
    let Some(img) = qemu_img() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("master.raw");
    std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
    let mut reqs: Vec<_> = (0..10)
        .map(|i| OverlayRequest {
            base: base.clone(),
            base_format: DiskFormat::Raw,
            path: dir.path().join(format!("vm{i}.qcow2")),
        })
        .collect();
    // The last one cannot be written: its directory does not exist.
    reqs.push(OverlayRequest {
        base: base.clone(),
        base_format: DiskFormat::Raw,
        path: dir.path().join("missing/vm10.qcow2"),
    });
    let e = create_overlays(&img, &reqs).unwrap_err();
    assert!(matches!(e, v2m::V2mError::Overlay { .. }), "{e}");
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files,
        vec![std::ffi::OsString::from("master.raw")],
        "partial overlay set left behind"
    );
}

#[test]
fn bad_requests_are_refused_before_any_work() {
    let Some(img) = qemu_img() else { return };
    let dir = tempfile::tempdir().unwrap();
    let req = |base: &Path, path: &Path| OverlayRequest {
        base: base.to_path_buf(),
        base_format: DiskFormat::Qcow2,
        path: path.to_path_buf(),
    };
    let e = create_overlays(
        &img,
        &[req(Path::new("relative.img"), &dir.path().join("a"))],
    )
    .unwrap_err();
    assert!(e.to_string().contains("absolute"), "{e}");
    let e = create_overlays(
        &img,
        &[req(&dir.path().join("nope.img"), &dir.path().join("a"))],
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}
