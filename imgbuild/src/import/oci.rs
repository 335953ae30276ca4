//! OCI image layouts (`oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`): `index.json` → (nested
//! index →) manifest → config + layers, each blob checked against its descriptor's digest
//! and size before it is parsed or unpacked.

use super::blobs::{Digest, Store};
use super::{ImageDesc, ImportError, LayerRef};
use std::collections::BTreeMap;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Debug, serde::Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Debug, serde::Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The parts of an image config (OCI and Docker share them) the importer uses.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ImageConfig {
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub architecture: Option<String>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    what: &str,
    data: &[u8],
) -> Result<T, ImportError> {
    serde_json::from_slice(data).map_err(|e| ImportError::Source {
        what: what.to_string(),
        reason: format!("not the expected JSON: {e}"),
    })
}

fn digest(what: &str, s: &str) -> Result<Digest, ImportError> {
    Digest::parse(s).map_err(|reason| ImportError::Source {
        what: what.to_string(),
        reason,
    })
}

/// Reads the image `tag` (or the only one) of the layout in `store`, for `arch`.
pub(super) fn open(store: Store, tag: Option<&str>, arch: &str) -> Result<ImageDesc, ImportError> {
    let layout: serde_json::Value = parse_json("oci-layout", &store.read_small("oci-layout")?)?;
    if layout.get("imageLayoutVersion").and_then(|v| v.as_str()) != Some("1.0.0") {
        return Err(ImportError::Source {
            what: "oci-layout".into(),
            reason: "imageLayoutVersion is not 1.0.0; not an OCI image layout".into(),
        });
    }
    let index: Index = parse_json("index.json", &store.read_small("index.json")?)?;
    let mut desc = pick_tag(&index.manifests, tag)?;
    // A multi-platform image: an index per platform, at most a couple of levels deep.
    for _ in 0..4 {
        if !INDEX_TYPES.contains(&desc.media_type.as_str()) {
            break;
        }
        let d = digest("index", &desc.digest)?;
        let nested: Index = parse_json(
            &desc.digest,
            &store.read_verified(&d.blob_path(), &d, Some(desc.size))?,
        )?;
        desc = pick_platform(&nested.manifests, arch)?;
    }
    let mdigest = digest("manifest", &desc.digest)?;
    let manifest: Manifest = parse_json(
        &desc.digest,
        &store.read_verified(&mdigest.blob_path(), &mdigest, Some(desc.size))?,
    )?;
    let cdigest = digest("config", &manifest.config.digest)?;
    let config: ImageConfig = parse_json(
        &manifest.config.digest,
        &store.read_verified(&cdigest.blob_path(), &cdigest, Some(manifest.config.size))?,
    )?;
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| r.diff_ids.clone())
        .unwrap_or_default();
    if diff_ids.len() != manifest.layers.len() {
        return Err(ImportError::Source {
            what: manifest.config.digest.clone(),
            reason: format!(
                "the config lists {} layer diff_ids but the manifest {} layers",
                diff_ids.len(),
                manifest.layers.len()
            ),
        });
    }
    let layers = manifest
        .layers
        .iter()
        .zip(&diff_ids)
        .map(|(l, id)| {
            let d = digest("layer", &l.digest)?;
            Ok(LayerRef {
                name: d.blob_path(),
                digest: Some(d),
                size: Some(l.size),
                diff_id: Some(digest("diff_id", id)?),
            })
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    Ok(ImageDesc {
        store,
        source_digest: mdigest.to_string(),
        config_digest: Some(cdigest.to_string()),
        config,
        layers,
    })
}

fn pick_tag(ms: &[Descriptor], tag: Option<&str>) -> Result<Descriptor, ImportError> {
    let tags: Vec<&str> = ms
        .iter()
        .filter_map(|m| m.annotations.get(REF_NAME).map(String::as_str))
        .collect();
    let found: Vec<&Descriptor> = match tag {
        Some(t) => ms
            .iter()
            .filter(|m| m.annotations.get(REF_NAME).is_some_and(|r| r == t))
            .collect(),
        None => ms.iter().collect(),
    };
    match (found.as_slice(), tag) {
        ([one], _) => Ok((*one).clone()),
        ([], Some(t)) => Err(ImportError::NoSuchImage {
            wanted: t.to_string(),
            available: tags.join(", "),
        }),
        (_, _) => Err(ImportError::NoSuchImage {
            wanted: "one image".into(),
            available: format!(
                "{} images ({}); hint: name one as oci:DIR:TAG",
                found.len(),
                tags.join(", ")
            ),
        }),
    }
}

fn pick_platform(ms: &[Descriptor], arch: &str) -> Result<Descriptor, ImportError> {
    ms.iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .cloned()
        .ok_or_else(|| ImportError::NoSuchImage {
            wanted: format!("linux/{arch}"),
            available: ms
                .iter()
                .filter_map(|m| m.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `2025-05-20T00:00:00Z`, `2025-05-20T00:00:00.123456789+02:00` → Unix seconds.
pub(super) fn parse_rfc3339(s: &str) -> Option<u64> {
    let (date, rest) = s.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let (y, m, day) = (d.next()?, d.next()?, d.next()?);
    let hms: String = rest.chars().take(8).collect();
    let tz = rest.get(8..)?;
    let tz = tz.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    let offset: i64 = match tz {
        "Z" | "z" | "" => 0,
        _ => {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            let (h, mi) = tz.get(1..)?.split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 3600 + mi.parse::<i64>().ok()? * 60)
        }
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mon = MONTHS.get(m.parse::<usize>().ok()?.checked_sub(1)?)?;
    let local = crate::plan::parse_release_date(&format!("{day} {mon} {y} {hms}"))?;
    u64::try_from(local as i64 - offset).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_timestamps() {
        assert_eq!(
            super::parse_rfc3339("2025-05-10T08:00:00Z"),
            Some(1_746_864_000)
        );
        assert_eq!(
            super::parse_rfc3339("2025-05-10T10:00:00.5+02:00"),
            Some(1_746_864_000)
        );
        assert_eq!(super::parse_rfc3339("yesterday"), None);
    }
}
