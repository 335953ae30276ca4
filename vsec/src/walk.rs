//! The formats' own key lists, walked from serde's derive: the tables that must cover every
//! field (how a policy field stacks, where each field takes effect) are checked against them,
//! so a field added to a format without its rows fails a test.

use crate::{policy::raw as policy, spec::raw as spec};
use serde::de::{self, Deserialize, Visitor};

/// A deserializer that only records the field list serde's derive passes to
/// `deserialize_struct`: the format's own list of a struct's keys.
struct Fields<'a>(&'a mut Option<&'static [&'static str]>);

#[derive(Debug)]
struct Stop;
impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields recorded")
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> de::Deserializer<'de> for Fields<'_> {
    type Error = Stop;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        *self.0 = Some(fields);
        Err(Stop)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The keys of a struct `T` as its format spells them.
pub fn fields<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let mut got = None;
    let _ = T::deserialize(Fields(&mut got));
    got.expect("a struct with named fields")
}

/// Every key of a format, dotted, from its sections (a key whose value is a struct of
/// further keys is a section, not a key).
fn keys(secs: &[(&str, &[&str])]) -> Vec<String> {
    let mut keys = vec![];
    for (prefix, fs) in secs {
        for f in *fs {
            let key = if prefix.is_empty() {
                f.to_string()
            } else {
                format!("{prefix}.{f}")
            };
            if !secs.iter().any(|(p, _)| *p == key) {
                keys.push(key);
            }
        }
    }
    keys
}

/// Every key of the policy format.
pub fn policy_keys() -> Vec<String> {
    keys(&[
        ("", fields::<policy::RawPolicy>()),
        ("distributions", fields::<policy::RawDistribution>()),
        ("repositories", fields::<policy::RawRepositories>()),
        ("packages", fields::<policy::RawPackages>()),
        ("limits", fields::<policy::RawLimits>()),
        ("defaults", fields::<policy::RawDefaults>()),
        ("files", fields::<policy::RawFiles>()),
        ("users", fields::<policy::RawUsers>()),
        ("network", fields::<policy::RawNetwork>()),
        ("checkpoint", fields::<policy::RawCheckpointRule>()),
        ("hypervisors", fields::<policy::RawHypervisors>()),
        ("migration", fields::<policy::RawMigration>()),
        ("migration.barrier", fields::<policy::RawBarrier>()),
        ("images", fields::<policy::RawImages>()),
        ("shares", fields::<policy::RawShares>()),
        ("audit", fields::<policy::RawAudit>()),
        ("authority", fields::<policy::RawAuthority>()),
        ("cache", fields::<policy::RawCache>()),
    ])
}

/// Every key of the spec format.
pub fn spec_keys() -> Vec<String> {
    keys(&[
        ("", fields::<spec::RawSpec>()),
        ("base", fields::<spec::RawBase>()),
        ("files", fields::<spec::RawFile>()),
        ("groups", fields::<spec::RawGroup>()),
        ("users", fields::<spec::RawUser>()),
        ("resources", fields::<spec::RawResources>()),
        ("checkpoint", fields::<spec::RawCheckpoint>()),
    ])
}
