//! Image import (`imgbuild::import::import`, what `vse import` runs) of OCI archives and
//! `docker save` archives: the outer tar (indexed by the blob store), `index.json` (nested
//! indexes, platform and tag choice), manifests, the config, digest and size checks, then
//! every layer (magic-sniffed decompression, diff_id check, OCI whiteouts, opaque dirs, path
//! confinement) into a scratch root. The kernel plan is empty, so the import always stops
//! after the layers (at the kernel), before anything needs a build environment. Afterwards
//! nothing may exist outside the scratch root.
//!
//! Input: a raw archive, or a structured image whose digests, sizes and diff_ids the harness
//! computes (the fuzzer cannot), with fuzzer-chosen overrides of each JSON document.
#![no_main]

use arbitrary::Arbitrary;
use imgbuild::build::AgentBinary;
use imgbuild::import::{ImportOptions, Source, import};
use imgbuild::plan::BuildPlan;
use imgbuild::progress::Silent;
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use vse_fuzz::{Scratch, TarEntry, TarName, build_tar, compress};

/// First byte: 0 a raw OCI archive, 1 a raw docker archive (the rest is the archive), 2 a
/// structured OCI image, 3 a structured docker image (the rest is an [`Image`]).
#[derive(Debug)]
enum Input {
    Raw { docker: bool, archive: Vec<u8> },
    Oci(Image),
    Docker(Image),
}

#[derive(Debug, Arbitrary)]
struct Image {
    layers: Vec<Layer>,
    config_raw: Option<Vec<u8>>,
    manifest_raw: Option<Vec<u8>>,
    index_raw: Option<Vec<u8>>,
    /// Wrong size in the manifest's layer descriptor.
    size_skew: u8,
    extra: Vec<(TarName, Vec<u8>)>,
    tag: Option<String>,
}

#[derive(Debug, Arbitrary)]
struct Layer {
    entries: Vec<TarEntry>,
    comp: u8,
    /// Replaces the built tar when set (before compression).
    raw: Option<Vec<u8>>,
}

fn hex256(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn file(name: &str, data: Vec<u8>) -> TarEntry {
    TarEntry {
        name: TarName::Raw(name.as_bytes().to_vec()),
        kind: 0,
        mode: 0o644,
        link: TarName::Raw(vec![]),
        data,
        uid: 0,
    }
}

const ELF: &[u8] = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0";

fn build(img: &Image, docker: bool) -> Vec<u8> {
    let mut members = Vec::new();
    let mut diff_ids = Vec::new();
    let mut layer_descs = Vec::new();
    let mut docker_layers = Vec::new();
    for l in img.layers.iter().take(4) {
        let tar = l.raw.clone().unwrap_or_else(|| build_tar(&l.entries));
        diff_ids.push(format!("sha256:{}", hex256(&tar)));
        let stored = compress(l.comp, &tar);
        let h = hex256(&stored);
        layer_descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{h}"),
            "size": stored.len() as u64 + u64::from(img.size_skew % 2),
        }));
        if docker {
            docker_layers.push(format!("{h}/layer.tar"));
            members.push(file(&format!("{h}/layer.tar"), stored));
        } else {
            members.push(file(&format!("blobs/sha256/{h}"), stored));
        }
    }
    let config = img.config_raw.clone().unwrap_or_else(|| {
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux", "created": "2024-05-01T00:00:00Z",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("json")
    });
    let ch = hex256(&config);
    if docker {
        members.push(file(&format!("{ch}.json"), config));
        let manifest = img.manifest_raw.clone().unwrap_or_else(|| {
            serde_json::to_vec(&serde_json::json!([{
                "Config": format!("{ch}.json"),
                "RepoTags": ["fuzz:latest"],
                "Layers": docker_layers,
            }]))
            .expect("json")
        });
        members.push(file("manifest.json", manifest));
    } else {
        let config_len = config.len();
        members.push(file(&format!("blobs/sha256/{ch}"), config));
        let manifest = img.manifest_raw.clone().unwrap_or_else(|| {
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": format!("sha256:{ch}"), "size": config_len},
                "layers": layer_descs,
            }))
            .expect("json")
        });
        let mh = hex256(&manifest);
        let manifest_len = manifest.len();
        members.push(file(&format!("blobs/sha256/{mh}"), manifest));
        let index = img.index_raw.clone().unwrap_or_else(|| {
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "manifests": [{
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": format!("sha256:{mh}"), "size": manifest_len,
                    "annotations": {"org.opencontainers.image.ref.name": "latest"},
                    "platform": {"architecture": "amd64", "os": "linux"},
                }],
            }))
            .expect("json")
        });
        members.push(file("index.json", index));
        members.push(file(
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ));
    }
    for (name, data) in img.extra.iter().take(4) {
        members.push(TarEntry {
            name: TarName::Raw(name.bytes()),
            kind: 0,
            mode: 0o644,
            link: TarName::Raw(vec![]),
            data: data.clone(),
            uid: 0,
        });
    }
    build_tar(&members)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let structured = || Image::arbitrary_take_rest(arbitrary::Unstructured::new(rest));
    let input = match mode % 4 {
        0 | 1 => Input::Raw {
            docker: mode % 4 == 1,
            archive: rest.to_vec(),
        },
        2 => match structured() {
            Ok(i) => Input::Oci(i),
            Err(_) => return,
        },
        _ => match structured() {
            Ok(i) => Input::Docker(i),
            Err(_) => return,
        },
    };
    let (docker, tag, archive) = match &input {
        Input::Raw { docker, archive } => (*docker, None, archive.clone()),
        Input::Oci(img) => (false, img.tag.clone(), build(img, false)),
        Input::Docker(img) => (true, img.tag.clone(), build(img, true)),
    };
    let s = Scratch::new();
    let path = s.dir.path().join("a/b/c/image.tar");
    std::fs::write(&path, &archive).expect("write archive");
    let mut given = format!(
        "{}:{}",
        if docker {
            "docker-archive"
        } else {
            "oci-archive"
        },
        path.display()
    );
    if let Some(t) = tag.filter(|t| !t.is_empty() && !t.contains('\0')) {
        given.push(':');
        given.push_str(&t);
    }
    let Ok(src) = Source::parse(&given) else {
        return;
    };
    let mut opts = ImportOptions::new(s.root.join("out"), AgentBinary::Embedded(ELF));
    opts.cache_root = s.root.join("cache");
    opts.jobs = 1;
    opts.layer_limit = 8 << 20;
    opts.source_date_epoch = Some("1700000000".into());
    let kernel = BuildPlan {
        lock_hash: "sha256:0".into(),
        epoch: 0,
        packages: vec![],
    };
    let r = import(&src, &kernel, &opts, &Silent);
    assert!(r.is_err(), "an import without a kernel succeeded");
    s.check_confined(&[path]);
});
