//! The `.ci/` scripts' env files (`KEY="value"` lines) that name the test guests.

use crate::BenchError;
use std::path::{Path, PathBuf};

/// `$VSE_CACHE/fixtures/<name>`, where `.ci/fixtures.sh` and `.ci/migrate-guest.sh` write.
pub fn default_env_file(name: &str) -> PathBuf {
    vse_base::cache_root().join("fixtures").join(name)
}

/// The values of one env file.
pub struct EnvFile {
    path: PathBuf,
    text: String,
}

impl EnvFile {
    pub fn read(path: &Path) -> std::io::Result<Self> {
        Ok(EnvFile {
            path: path.to_path_buf(),
            text: std::fs::read_to_string(path)?,
        })
    }

    pub fn get(&self, key: &str) -> Result<String, BenchError> {
        value(&self.text, key)
            .ok_or_else(|| BenchError::Invalid(format!("{}: no {key}= line", self.path.display())))
    }
}

fn value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_are_unquoted_and_keys_whole() {
        let t = "A_B=\"x y\"\nA=1\n";
        assert_eq!(super::value(t, "A").as_deref(), Some("1"));
        assert_eq!(super::value(t, "A_B").as_deref(), Some("x y"));
        assert_eq!(super::value(t, "B"), None);
    }
}
