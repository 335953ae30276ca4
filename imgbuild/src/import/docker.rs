//! `docker save` archives (`docker-archive:FILE[:REPO:TAG]`): `manifest.json` names the config
//! and the layer tars. The config is named by its own digest (Docker's image id) and is checked
//! against it; each layer is checked against the config's `diff_ids` while it is unpacked
//! (and first against its blob digest when the archive stores it OCI-style).

use super::blobs::{Digest, Store};
use super::oci::{ImageConfig, parse_json};
use super::{ImageDesc, ImportError, LayerRef};

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// `blobs/sha256/<hex>` or `<hex>.json` / `<hex>.tar`: the digest a member's name gives.
fn named_digest(name: &str) -> Option<Digest> {
    let base = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json"))
        .or_else(|| name.strip_suffix(".tar"))?;
    Digest::parse(&format!("sha256:{base}")).ok()
}

/// `docker.io/library/debian:12` also answers to `debian:12` and `library/debian:12`.
fn tag_matches(have: &str, want: &str) -> bool {
    have == want
        || have.strip_prefix("docker.io/") == Some(want)
        || have.strip_prefix("docker.io/library/") == Some(want)
}

pub(super) fn open(store: Store, tag: Option<&str>) -> Result<ImageDesc, ImportError> {
    let entries: Vec<Entry> = parse_json("manifest.json", &store.read_small("manifest.json")?)?;
    let tags = || {
        entries
            .iter()
            .flat_map(|e| e.repo_tags.iter().flatten())
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen: Vec<&Entry> = match tag {
        Some(t) => entries
            .iter()
            .filter(|e| e.repo_tags.iter().flatten().any(|h| tag_matches(h, t)))
            .collect(),
        None => entries.iter().collect(),
    };
    let entry = match chosen.as_slice() {
        [one] => *one,
        [] => {
            return Err(ImportError::NoSuchImage {
                wanted: tag.unwrap_or("an image").to_string(),
                available: tags(),
            });
        }
        _ => {
            return Err(ImportError::NoSuchImage {
                wanted: "one image".into(),
                available: format!(
                    "{} images ({}); hint: name one as docker-archive:FILE:REPO:TAG",
                    chosen.len(),
                    tags()
                ),
            });
        }
    };
    let cdigest = named_digest(&entry.config).ok_or_else(|| ImportError::Source {
        what: entry.config.clone(),
        reason: "the config is not named by its digest, so it cannot be verified".into(),
    })?;
    let config: ImageConfig = parse_json(
        &entry.config,
        &store.read_verified(&entry.config, &cdigest, None)?,
    )?;
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| r.diff_ids.clone())
        .unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(ImportError::Source {
            what: entry.config.clone(),
            reason: format!(
                "the config lists {} layer diff_ids but manifest.json {} layers",
                diff_ids.len(),
                entry.layers.len()
            ),
        });
    }
    let layers = entry
        .layers
        .iter()
        .zip(&diff_ids)
        .map(|(name, id)| {
            let diff_id = Digest::parse(id).map_err(|reason| ImportError::Source {
                what: entry.config.clone(),
                reason,
            })?;
            Ok(LayerRef {
                name: name.clone(),
                // Only a blob path names the stored bytes; `<diff_id>.tar` is checked as diff_id.
                digest: name
                    .starts_with("blobs/")
                    .then(|| named_digest(name))
                    .flatten(),
                size: None,
                diff_id: Some(diff_id),
            })
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    Ok(ImageDesc {
        store,
        source_digest: cdigest.to_string(),
        config_digest: Some(cdigest.to_string()),
        config,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_digests_and_tags_normalise() {
        let h = "b".repeat(64);
        assert_eq!(named_digest(&format!("{h}.json")).unwrap().hex(), h);
        assert_eq!(named_digest(&format!("blobs/sha256/{h}")).unwrap().hex(), h);
        assert!(named_digest("abc/layer.tar").is_none());
        assert!(tag_matches("docker.io/library/debian:12", "debian:12"));
        assert!(tag_matches("docker.io/vse/deb:test", "vse/deb:test"));
        assert!(!tag_matches("docker.io/vse/deb:test", "deb:test"));
    }
}
