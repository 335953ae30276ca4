use super::files::{publish, sum};
use super::*;
use crate::spec::{Nic, VmSpec};
use vse_image::{ImageDir, MANIFEST, Manifest, Part};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// An image directory; `digests` gives its parts SHA-256s in the manifest (else none).
fn image(dir: &Path, cmdline: &str, digests: bool) -> ImageDir {
    let mut parts = BTreeMap::new();
    for (name, file) in [
        ("kernel", "vmlinuz"),
        ("initrd", "initrd.img"),
        ("root", "root.raw"),
    ] {
        let path = dir.join(file);
        if !path.exists() {
            std::fs::write(&path, name).unwrap();
        }
        let sha256 = if digests {
            format!("{name}-digest")
        } else {
            String::new()
        };
        let size = std::fs::metadata(&path).unwrap().len();
        parts.insert(
            name.into(),
            Part {
                file: file.into(),
                size,
                sha256,
            },
        );
    }
    let m = Manifest::assembled("test", cmdline, parts);
    std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
    ImageDir::open(dir).unwrap()
}

fn qemu() -> Option<v2m::qemu::QemuPlugin> {
    testkit::require!(testkit::tool("qemu-system-x86_64"));
    Some(v2m::qemu::QemuPlugin::new(Default::default()))
}

fn nic(mac: &str, port: u16) -> Nic {
    Nic {
        mac: mac.parse().unwrap(),
        local: format!("127.0.0.1:{port}").parse().unwrap(),
        remote: "127.0.0.1:5000".parse().unwrap(),
    }
}

#[test]
fn the_key_changes_with_each_input_and_only_with_them() {
    let Some(q) = qemu() else { return };
    let d = tmp();
    let img = image(d.path(), "console=ttyS0", true);
    let spec = VmSpec::new(&img, "vm-0".parse().unwrap(), 1, 256);
    let base = TemplateInputs::of(&q, &spec).unwrap();
    let key = base.key();
    assert_eq!(key.len(), 64);
    assert_eq!(TemplateInputs::of(&q, &spec).unwrap().key(), key, "stable");

    // Per-VM values the restored VM gets anew: same key.
    let mut other = VmSpec::new(&img, "vm-7".parse().unwrap(), 1, 256);
    other.pin_on(&[1], 2).unwrap();
    // The node its memory is bound to is an input (below): only the cores are per-VM.
    other.numa_node = spec.numa_node;
    assert_eq!(TemplateInputs::of(&q, &other).unwrap().key(), key);
    let mut a = spec.clone();
    a.nic = Some(nic("02:fb:00:00:00:01", 4001));
    let mut b = spec.clone();
    b.nic = Some(nic("02:fb:00:00:00:02", 4002));
    let with_nic = TemplateInputs::of(&q, &a).unwrap().key();
    assert_eq!(TemplateInputs::of(&q, &b).unwrap().key(), with_nic);

    // Each input: a new key.
    let mut keys = vec![key.clone(), with_nic];
    let mut more_cpus = spec.clone();
    more_cpus.vcpus = 2;
    let mut more_mem = spec.clone();
    more_mem.memory_mib = 512;
    for s in [&more_cpus, &more_mem] {
        keys.push(TemplateInputs::of(&q, s).unwrap().key());
    }
    let cmdline = image(d.path(), "console=ttyS0 quiet", true);
    let spec_of = |img: &ImageDir| VmSpec::new(img, "vm-0".parse().unwrap(), 1, 256);
    keys.push(TemplateInputs::of(&q, &spec_of(&cmdline)).unwrap().key());
    // The image's content: its parts' digests, or the files themselves when undigested.
    let undigested = image(d.path(), "console=ttyS0", false);
    let before = TemplateInputs::of(&q, &spec_of(&undigested)).unwrap().key();
    keys.push(before.clone());
    std::fs::write(d.path().join("initrd.img"), "a changed initramfs").unwrap();
    let changed = image(d.path(), "console=ttyS0", false);
    keys.push(TemplateInputs::of(&q, &spec_of(&changed)).unwrap().key());
    let fields: [&dyn Fn(&mut TemplateInputs); 5] = [
        &|i| i.hypervisor_build.push_str(" 9.0"),
        &|i| i.hypervisor = PluginKind::Libvirt,
        &|i| i.numa_node = Some(0),
        &|i| i.disks.push("raw,ro".into()),
        &|i| i.format += 1,
    ];
    for f in fields {
        let mut i = base.clone();
        f(&mut i);
        keys.push(i.key());
    }
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "every input changes the key");
}

fn inputs() -> TemplateInputs {
    TemplateInputs {
        format: TEMPLATE_FORMAT,
        image_manifest_sha256: "m".into(),
        image_files: vec![],
        cmdline: "console=ttyS0".into(),
        vcpus: 1,
        memory_mib: 256,
        numa_node: None,
        disks: vec!["qcow2".into()],
        nic: "none".into(),
        hypervisor: PluginKind::Qemu,
        hypervisor_build: "QEMU emulator version 7.2".into(),
    }
}

/// A complete template of `inputs` in `t`, as a save publishes it.
fn plant(t: &Templates, inputs: &TemplateInputs) -> PathBuf {
    let dir = t.path(&inputs.key());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(STATE), vec![7u8; 100_000]).unwrap();
    std::fs::write(dir.join(ROOT), b"qcow2 overlay").unwrap();
    let files = [STATE, ROOT]
        .into_iter()
        .map(|n| (n.to_string(), sum(&dir.join(n)).unwrap()))
        .collect();
    let meta = Meta {
        key: inputs.key(),
        inputs: inputs.clone(),
        backing: "/images/root.raw".into(),
        files,
        next_request_id: 9,
    };
    std::fs::write(dir.join(META), serde_json::to_vec(&meta).unwrap()).unwrap();
    dir
}

#[test]
fn a_damaged_or_foreign_template_is_refused_and_discarded() {
    let d = tmp();
    let t = Templates::new(d.path().join(".templates"));
    let i = inputs();
    assert!(t.lookup(&i).unwrap().is_none(), "none yet");
    // Intact: found.
    let dir = plant(&t, &i);
    let found = t.lookup(&i).unwrap().expect("the planted template");
    assert_eq!(found.meta.backing, Path::new("/images/root.raw"));
    assert_eq!(found.state(), dir.join(STATE));

    type Damage = fn(&Path);
    let damages: [(&str, Damage); 5] = [
        ("truncated state", |d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join(STATE))
                .unwrap();
            f.set_len(50_000).unwrap();
        }),
        ("a flipped byte", |d| {
            std::fs::write(d.join(ROOT), b"qcow2 overlaY").unwrap()
        }),
        ("no overlay", |d| {
            std::fs::remove_file(d.join(ROOT)).unwrap()
        }),
        ("half a meta file", |d| {
            let m = std::fs::read(d.join(META)).unwrap();
            std::fs::write(d.join(META), &m[..m.len() / 2]).unwrap();
        }),
        ("other inputs", |d| {
            let text = std::fs::read_to_string(d.join(META)).unwrap();
            std::fs::write(d.join(META), text.replace("\"vcpus\":1", "\"vcpus\":2")).unwrap();
        }),
    ];
    for (what, damage) in damages {
        let dir = plant(&t, &i);
        damage(&dir);
        let e = t.lookup(&i).expect_err(what);
        eprintln!("{what}: {e}");
        assert!(!dir.exists(), "{what}: the template is discarded");
        assert!(t.lookup(&i).unwrap().is_none(), "{what}: and gone");
    }
    // Nothing but the (empty) store is left: no trash.
    assert_eq!(std::fs::read_dir(t.dir()).unwrap().count(), 0);
}

#[test]
fn one_publisher_wins() {
    let d = tmp();
    let (a, b, dst) = (d.path().join("a"), d.path().join("b"), d.path().join("key"));
    for x in [&a, &b] {
        std::fs::create_dir(x).unwrap();
        std::fs::write(x.join(STATE), x.to_str().unwrap()).unwrap();
    }
    assert!(publish(&a, &dst).unwrap());
    assert!(!publish(&b, &dst).unwrap(), "the second publisher loses");
    assert!(!b.exists(), "and drops its own");
    assert_eq!(
        std::fs::read_to_string(dst.join(STATE)).unwrap(),
        a.to_str().unwrap()
    );
}
