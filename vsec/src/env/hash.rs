//! Deterministic hash of an effective environment, for the lockfile: sha256 over canonical
//! JSON (sorted keys, no whitespace) of the values with provenance stripped, so moving a
//! line in a spec does not invalidate a lock but changing any value does.

use super::EffectiveEnv;
use serde_json::Value;
use sha2::{Digest, Sha256};

impl EffectiveEnv {
    /// `sha256:<hex>` of [`canonical_json`].
    pub fn env_hash(&self) -> String {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(canonical_json(self).as_bytes()))
        )
    }
}

/// The environment's values as JSON with sorted keys and every `{value, from}` pair
/// replaced by its value.
pub fn canonical_json(env: &EffectiveEnv) -> String {
    // serde_json without `preserve_order` keeps object keys in a BTreeMap: sorted.
    let v = serde_json::to_value(env).unwrap_or(Value::Null);
    strip(v).to_string()
}

fn strip(v: Value) -> Value {
    match v {
        Value::Object(mut m) => {
            if m.len() == 2 && m.contains_key("from") && m.contains_key("value") {
                return strip(m.remove("value").unwrap_or(Value::Null));
            }
            Value::Object(m.into_iter().map(|(k, v)| (k, strip(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
        other => other,
    }
}
