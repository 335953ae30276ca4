//! Validated identifiers. They end up in SQL rows, Prometheus labels and CSV cells, so the
//! alphabet is restricted to characters that need no escaping in any of them.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} `{value}`: {why}; expected 1-128 characters from [A-Za-z0-9._:@-]")]
pub struct IdError {
    pub kind: &'static str,
    pub value: String,
    pub why: &'static str,
}

fn validate(kind: &'static str, value: &str) -> Result<(), IdError> {
    let err = |why| IdError {
        kind,
        value: value.chars().take(64).collect(),
        why,
    };
    if value.is_empty() {
        return Err(err("it is empty"));
    }
    if value.len() > 128 {
        return Err(err("it is too long"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
    {
        return Err(err("it contains a character outside the allowed set"));
    }
    Ok(())
}

macro_rules! id_type {
    ($name:ident, $kind:literal) => {
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate($kind, &value)?;
                Ok(Self(value))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }
        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(JobId, "job id");
id_type!(NodeName, "node name");
id_type!(VmId, "VM id");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_ids() {
        assert!(NodeName::new("n1").is_ok());
        assert!(NodeName::new("").is_err());
        assert!(VmId::new("vm\"1").is_err());
        assert!(JobId::new("a".repeat(129)).is_err());
        let e = serde_json::from_str::<VmId>("\"a b\"").unwrap_err();
        assert!(e.to_string().contains("invalid VM id"), "{e}");
    }
}
