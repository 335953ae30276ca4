//! `vse import` end to end with the real binary and real fixtures: a Debian rootfs made by
//! mmdebstrap, turned into OCI and Docker archives by umoci and skopeo (tests/support/oci.rs),
//! layers written here with the `tar` crate (whiteouts, an opaque directory, a hard link), and
//! hostile tarballs. The imported image boots under `vse run`.

mod support;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Output;
use support::oci::{DebianOci, TAG, debian_oci};
use support::vm::{no_qemu_left, vm_slot, vm_tools};
use support::{host_lists, vse};

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A lock with the cloud kernel and busybox-static, made once per test by `vse lock`.
fn kernel_lock(dir: &Path) -> PathBuf {
    let lock = dir.join("minimal.lock");
    let o = vse()
        .args(["lock", "--allow-expired", "-q"])
        .arg(support::specs().join("minimal.vse.yaml"))
        .arg("-o")
        .arg(&lock)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    lock
}

fn import(source: &str, out: &Path, extra: &[&str]) -> Output {
    vse()
        .args(["import", source, "--json", "-o"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn fixture() -> Option<DebianOci> {
    if !host_lists() {
        return None;
    }
    debian_oci()
}

fn sha256(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One tar entry: path, kind (`d`ir, `f`ile, sym`l`ink, `h`ard link), content or target.
type Row<'a> = (&'a str, char, &'a str);

/// A tar layer from rows, with fixed metadata.
fn layer(rows: &[Row]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data) in rows {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        let (ty, body): (tar::EntryType, &[u8]) = match kind {
            'd' => (tar::EntryType::Directory, b""),
            'f' => (tar::EntryType::Regular, data.as_bytes()),
            'l' => (tar::EntryType::Symlink, b""),
            'h' => (tar::EntryType::Link, b""),
            _ => unreachable!(),
        };
        if matches!(kind, 'l' | 'h') {
            h.as_old_mut().linkname[..data.len()].copy_from_slice(data.as_bytes());
        }
        h.set_entry_type(ty);
        h.set_mode(if *kind == 'd' { 0o755 } else { 0o644 });
        h.set_mtime(1_747_699_200);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append(&h, body).unwrap();
    }
    b.into_inner().unwrap()
}

/// The fixture's layout plus two layers made here, as tag `layered`: the lower one (gzip) adds
/// files, the upper one (zstd) deletes one, makes a directory opaque and adds a hard link.
fn layered_layout(fx: &DebianOci, dir: &Path) -> PathBuf {
    let out = dir.join("layered");
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for e in std::fs::read_dir(fx.layout.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        std::fs::hard_link(e.path(), blobs.join(e.file_name()))
            .or_else(|_| std::fs::copy(e.path(), blobs.join(e.file_name())).map(|_| ()))
            .unwrap();
    }
    std::fs::copy(fx.layout.join("oci-layout"), out.join("oci-layout")).unwrap();
    let read = |d: &str| -> serde_json::Value {
        let hex = d.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(blobs.join(hex)).unwrap()).unwrap()
    };
    let put = |data: &[u8]| -> (String, usize) {
        let h = sha256(data);
        std::fs::write(blobs.join(&h), data).unwrap();
        (format!("sha256:{h}"), data.len())
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.layout.join("index.json")).unwrap()).unwrap();
    let mut m = read(index["manifests"][0]["digest"].as_str().unwrap());
    let mut config = read(m["config"]["digest"].as_str().unwrap());
    let lower = layer(&[
        ("opt/", 'd', ""),
        ("opt/vse-test/", 'd', ""),
        ("opt/vse-test/keep", 'f', "kept-from-lower\n"),
        ("opt/vse-test/gone", 'f', "must-be-deleted\n"),
        ("opt/vse-test/dir/", 'd', ""),
        ("opt/vse-test/dir/old", 'f', "hidden-by-opaque\n"),
    ]);
    let upper = layer(&[
        ("opt/vse-test/.wh.gone", 'f', ""),
        ("opt/vse-test/dir/", 'd', ""),
        ("opt/vse-test/dir/.wh..wh..opq", 'f', ""),
        ("opt/vse-test/dir/new", 'f', "from-upper\n"),
        ("opt/vse-test/hl", 'h', "opt/vse-test/keep"),
    ]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &lower).unwrap();
    let lower_blob = gz.finish().unwrap();
    let upper_blob = zstd::encode_all(upper.as_slice(), 3).unwrap();
    for (raw, blob, ty) in [
        (
            &lower,
            &lower_blob,
            "application/vnd.oci.image.layer.v1.tar+gzip",
        ),
        (
            &upper,
            &upper_blob,
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ),
    ] {
        let (digest, size) = put(blob);
        m["layers"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"mediaType": ty, "digest": digest, "size": size}));
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .unwrap()
            .push(format!("sha256:{}", sha256(raw)).into());
    }
    let (cd, cs) = put(&serde_json::to_vec(&config).unwrap());
    m["config"]["digest"] = cd.into();
    m["config"]["size"] = cs.into();
    let (md, ms) = put(&serde_json::to_vec(&m).unwrap());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
        "annotations": {"org.opencontainers.image.ref.name": "layered"}}]});
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    out
}

#[test]
fn an_imported_layered_image_boots_and_honours_whiteouts() {
    if !vm_tools() {
        return;
    }
    let Some(fx) = fixture() else { return };
    let t = tempfile::tempdir().unwrap();
    let layout = layered_layout(&fx, t.path());
    let img = t.path().join("img");
    // No --kernel-from: the Debian cloud kernel of the host's suite, resolved like `vse lock`.
    let o = import(
        &format!("oci:{}:layered", layout.display()),
        &img,
        &["--allow-expired"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = manifest(&img);
    let imp = &m["imported"];
    assert_eq!(imp["source_kind"], "oci");
    assert_eq!(imp["layers"].as_array().unwrap().len(), 3);
    assert_eq!(imp["layers"][1]["compression"], "gzip");
    assert_eq!(imp["layers"][2]["compression"], "zstd");
    assert_eq!(imp["dpkg_database"], true);

    let run_dir = t.path().join("run");
    let _slot = vm_slot();
    let script = "cat /etc/os-release; cat /opt/vse-test/keep; ls /opt/vse-test/dir; \
        test -e /opt/vse-test/gone || echo gone-absent; stat -c 'links=%h' /opt/vse-test/hl; \
        dpkg-query -W -f='${Package}\\n' dpkg; uname -r";
    let o = vse()
        .arg("run")
        .arg(&img)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains("VERSION_CODENAME=bookworm"), "{out}");
    assert!(out.contains("kept-from-lower\n"), "{out}");
    assert!(
        out.contains("new\n") && !out.contains("old\n"),
        "opaque dir: {out}"
    );
    assert!(out.contains("gone-absent\n"), "{out}");
    assert!(out.contains("links=2\n"), "hard link: {out}");
    assert!(out.contains("dpkg\n"), "{out}");
    assert!(out.contains(m["kernel_version"].as_str().unwrap()), "{out}");
    no_qemu_left(&run_dir);
}

#[test]
fn the_same_archive_imports_byte_identically_and_policies_apply() {
    let Some(fx) = fixture() else { return };
    let t = tempfile::tempdir().unwrap();
    let lock = kernel_lock(t.path());
    let lock_s = lock.to_str().unwrap();
    let policy = t.path().join("imports.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: imports\nimages:\n  allow_imported: true\n  require_dpkg_database: true\n",
    )
    .unwrap();
    let src = format!("oci-archive:{}", fx.oci_archive.display());
    let (a, b, d) = (t.path().join("a"), t.path().join("b"), t.path().join("d"));
    let o = import(
        &src,
        &a,
        &[
            "--kernel-from",
            lock_s,
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = import(&src, &b, &["--kernel-from", lock_s]);
    assert!(o.status.success(), "{}", text(&o));
    let (ma, mb) = (manifest(&a), manifest(&b));
    assert_eq!(
        ma["parts"], mb["parts"],
        "two imports of one archive differ"
    );
    assert_eq!(
        ma["epoch"], 1_747_699_200,
        "epoch from the config's `created`"
    );
    let installed: Vec<&str> = ma["imported"]["installed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        installed.contains(&"dpkg") && installed.contains(&"perl-base"),
        "{installed:?}"
    );

    // The same image from `docker save` format: same root file system, other provenance.
    let o = import(
        &format!(
            "docker-archive:{}:vse/deb:test",
            fx.docker_archive.display()
        ),
        &d,
        &["--kernel-from", lock_s],
    );
    assert!(o.status.success(), "{}", text(&o));
    let md = manifest(&d);
    assert_eq!(md["parts"]["root"], ma["parts"]["root"]);
    assert_eq!(md["imported"]["source_kind"], "docker-archive");
    assert_eq!(
        md["imported"]["source_digest"],
        ma["imported"]["config_digest"]
    );

    // A forbidden package the image holds, and a policy that refuses imports: exit 2, naming
    // the policy line, nothing written.
    let deny = t.path().join("deny.policy.yaml");
    std::fs::write(
        &deny,
        "version: 1\nname: deny\npackages:\n  forbidden: [\"perl-base\"]\n",
    )
    .unwrap();
    let no = t.path().join("no");
    let o = import(
        &src,
        &no,
        &["--kernel-from", lock_s, "--policy", deny.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("deny.policy.yaml:4:") && text(&o).contains("perl-base"),
        "{}",
        text(&o)
    );
    std::fs::write(
        &deny,
        "version: 1\nname: deny\nimages:\n  allow_imported: false\n",
    )
    .unwrap();
    let o = import(
        &src,
        &no,
        &["--kernel-from", lock_s, "--policy", deny.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("deny.policy.yaml:4:"), "{}", text(&o));
    assert!(!no.exists());
}

/// A rootfs tarball with one hostile entry after harmless ones.
fn hostile_tar(dir: &Path, name: &str, rows: &[Row]) -> PathBuf {
    let mut all = vec![
        ("./", 'd', ""),
        ("etc/", 'd', ""),
        ("etc/hostname", 'f', "x\n"),
    ];
    all.extend_from_slice(rows);
    let p = dir.join(format!("{name}.tar"));
    std::fs::write(&p, layer(&all)).unwrap();
    p
}

#[test]
fn hostile_tarballs_are_refused_with_exit_2_and_leave_nothing() {
    if !host_lists() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let lock = kernel_lock(t.path());
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let cases: &[(&str, &[Row], &str)] = &[
        (
            "dotdot",
            &[("../outside/escaped", 'f', "x")],
            "contains `..`",
        ),
        ("absolute", &[("/outside-abs", 'f', "x")], "is absolute"),
        (
            "symlink-through",
            &[("evil", 'l', "../outside"), ("evil/escaped", 'f', "x")],
            "symlink /evil",
        ),
    ];
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    for (name, rows, want) in cases {
        let tar = hostile_tar(t.path(), name, rows);
        let out = work.join(name);
        let o = import(
            &format!("tar:{}", tar.display()),
            &out,
            &["--kernel-from", lock.to_str().unwrap()],
        );
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(text(&o).contains(want), "{name}: {}", text(&o));
        assert!(!out.exists(), "{name}: output left behind");
        assert_eq!(
            std::fs::read_dir(&work).unwrap().count(),
            0,
            "{name}: temp dir left"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{name}: escaped"
        );
    }
    assert!(!Path::new("/outside-abs").exists());

    // A harmless rootfs tarball without a dpkg database: refused by a policy that demands one,
    // imported otherwise, known by its own SHA-256, timestamps from its newest file.
    let plain = hostile_tar(t.path(), "plain", &[("opt/", 'd', "")]);
    let gz = t.path().join("plain.tar.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &std::fs::read(&plain).unwrap()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let policy = t.path().join("dpkg.policy.yaml");
    std::fs::write(
        &policy,
        "version: 1\nname: dpkg\nimages:\n  require_dpkg_database: true\n",
    )
    .unwrap();
    let src = format!("tar:{}", gz.display());
    let lock_s = lock.to_str().unwrap();
    let out = work.join("plain");
    let o = import(
        &src,
        &out,
        &[
            "--kernel-from",
            lock_s,
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("has no dpkg database") && text(&o).contains("dpkg.policy.yaml:4:"),
        "{}",
        text(&o)
    );
    assert!(!out.exists());
    let o = import(&src, &out, &["--kernel-from", lock_s]);
    assert!(o.status.success(), "{}", text(&o));
    let m = manifest(&out);
    assert_eq!(
        m["imported"]["source_digest"],
        format!("sha256:{}", sha256(&std::fs::read(&gz).unwrap()))
    );
    assert_eq!(m["imported"]["layers"][0]["compression"], "gzip");
    assert_eq!(m["imported"]["dpkg_database"], false);
    assert_eq!(m["epoch"], 1_747_699_200);
    std::fs::remove_dir_all(&out).unwrap();

    // A tampered OCI archive is refused by digest before anything is unpacked.
    let Some(fx) = debian_oci() else { return };
    let bad = t.path().join("tampered");
    std::fs::create_dir(&bad).unwrap();
    for f in ["oci-layout", "index.json"] {
        std::fs::copy(fx.layout.join(f), bad.join(f)).unwrap();
    }
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bad.join("index.json")).unwrap()).unwrap();
    let md = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap();
    std::fs::create_dir_all(bad.join("blobs/sha256")).unwrap();
    let mut mj = std::fs::read(fx.layout.join("blobs/sha256").join(md)).unwrap();
    mj[10] ^= 1;
    std::fs::write(bad.join("blobs/sha256").join(md), mj).unwrap();
    let out = work.join("tampered");
    let o = import(
        &format!("oci:{}:{TAG}", bad.display()),
        &out,
        &["--kernel-from", lock.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("tampered"), "{}", text(&o));
    assert!(!out.exists());
}

#[test]
fn check_explains_the_image_rules_and_refuses_a_widening() {
    let t = tempfile::tempdir().unwrap();
    let site = t.path().join("site.policy.yaml");
    let part = t.path().join("part.policy.yaml");
    std::fs::write(
        &site,
        "version: 1\nname: site\nimages:\n  allow_imported: false\n",
    )
    .unwrap();
    std::fs::write(
        &part,
        "version: 1\nname: part\nimages:\n  allow_imported: true\n  require_dpkg_database: true\n",
    )
    .unwrap();
    let spec = support::specs().join("minimal.vse.yaml");
    let o = vse()
        .arg("check")
        .arg(&spec)
        .arg("--policy")
        .arg(&site)
        .arg("--explain")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("images.allow_imported"))
        .unwrap();
    assert!(
        line.contains("false") && line.contains("site.policy.yaml:4:"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("images.require_dpkg_database"))
        .unwrap();
    assert!(line.contains("false") && line.contains("default"), "{out}");
    let o = vse()
        .arg("check")
        .arg(&spec)
        .args(["--policy"])
        .arg(&site)
        .arg("--policy")
        .arg(&part)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("part.policy.yaml:4:") && text(&o).contains("widens"),
        "{}",
        text(&o)
    );
}
