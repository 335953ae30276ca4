//! The spec as written: YAML shape only. Strings that need validation stay strings here
//! (with their position) and are checked in `parse.rs`, so all problems are reported at once.

use crate::yaml::At;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    pub version: At<u32>,
    pub name: At<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub base: RawBase,
    #[serde(default)]
    pub kernel: Option<At<String>>,
    #[serde(default)]
    pub packages: Vec<At<String>>,
    #[serde(default)]
    pub files: Vec<At<RawFile>>,
    #[serde(default)]
    pub groups: Vec<At<RawGroup>>,
    #[serde(default)]
    pub users: Vec<At<RawUser>>,
    #[serde(default)]
    pub environment: BTreeMap<String, At<String>>,
    #[serde(default)]
    pub post_install: Vec<At<String>>,
    #[serde(default)]
    pub resources: Option<RawResources>,
    #[serde(default)]
    pub checkpoint: Option<RawCheckpoint>,
    #[serde(default)]
    pub hypervisor: Option<At<String>>,
    #[serde(default)]
    pub shares: Vec<At<RawShare>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBase {
    pub distribution: At<String>,
    pub suite: At<String>,
    #[serde(default)]
    pub architecture: Option<At<String>>,
    #[serde(default)]
    pub components: Option<At<Vec<At<String>>>>,
    #[serde(default)]
    pub mirror: Option<At<String>>,
    #[serde(default)]
    pub snapshot: Option<At<String>>,
    #[serde(default)]
    pub variant: Option<At<String>>,
    #[serde(default)]
    pub recommends: Option<At<bool>>,
}

/// A file to add; shared with policies (required files).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    pub path: At<String>,
    #[serde(default)]
    pub content: Option<At<String>>,
    #[serde(default)]
    pub source: Option<At<String>>,
    #[serde(default)]
    pub mode: Option<At<String>>,
    #[serde(default)]
    pub owner: Option<At<String>>,
    #[serde(default)]
    pub group: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroup {
    pub name: At<String>,
    pub gid: At<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUser {
    pub name: At<String>,
    pub uid: At<u32>,
    #[serde(default)]
    pub groups: Vec<At<String>>,
    #[serde(default)]
    pub shell: Option<At<String>>,
    #[serde(default)]
    pub home: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResources {
    #[serde(default)]
    pub vcpus: Option<At<u32>>,
    #[serde(default)]
    pub memory: Option<At<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCheckpoint {
    pub mode: At<String>,
    #[serde(default)]
    pub interval: Option<At<String>>,
}

/// A `shares:` item: the string `HOST[:GUEST][:ro|:rw]`, or the map `{host, guest, mode}`
/// (for paths that hold a `:`).
#[derive(Debug)]
pub enum RawShare {
    Text(String),
    Map(Box<RawShareMap>),
}

#[derive(Debug)]
pub struct RawShareMap {
    pub host: At<String>,
    pub guest: Option<At<String>>,
    pub mode: Option<At<String>>,
}

/// By hand rather than `#[serde(untagged)]`, which buffers the input and so loses the
/// positions of the map's values and the unknown-key message.
impl<'de> Deserialize<'de> for RawShare {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawShare;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a share: `HOST[:GUEST][:ro|:rw]` or {host: PATH, guest: PATH, mode: ro|rw}",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawShare, E> {
                Ok(RawShare::Text(s.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawShare, A::Error> {
                const KEYS: &[&str] = &["host", "guest", "mode"];
                let (mut host, mut guest, mut mode) = (None, None, None);
                while let Some(k) = m.next_key::<String>()? {
                    let slot = match k.as_str() {
                        "host" => &mut host,
                        "guest" => &mut guest,
                        "mode" => &mut mode,
                        _ => return Err(de::Error::unknown_field(&k, KEYS)),
                    };
                    if slot.is_some() {
                        return Err(de::Error::custom(format!("duplicate mapping key: {k}")));
                    }
                    *slot = Some(m.next_value::<At<String>>()?);
                }
                let host = host.ok_or_else(|| de::Error::missing_field("host"))?;
                Ok(RawShare::Map(Box::new(RawShareMap { host, guest, mode })))
            }
        }
        d.deserialize_any(V)
    }
}
