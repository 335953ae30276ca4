//! The `Packages` index: one stanza per binary package, turned into typed [`Package`]s.

use super::deb822::{Deb822Error, Stanza, parse_stanzas};
use crate::deb::{Alternatives, Arch, DebVersion, PackageName, Relation, parse_relations};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Syntax(#[from] Deb822Error),
    #[error("{file}:{line}: package stanza has no `{field}` field (truncated or corrupted index?)")]
    Missing {
        file: PathBuf,
        line: usize,
        field: &'static str,
    },
    #[error("{file}:{line}: field `{field}` of package `{package}`: {message}")]
    Field {
        file: PathBuf,
        line: usize,
        package: String,
        field: &'static str,
        message: String,
    },
}

/// `Priority:`, ordered from most to least important.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Required,
    Important,
    Standard,
    Optional,
    Extra,
}

impl Priority {
    fn parse(s: &str) -> Priority {
        match s {
            "required" => Priority::Required,
            "important" => Priority::Important,
            "standard" => Priority::Standard,
            "extra" => Priority::Extra,
            // Unknown priorities are treated like `optional`, as apt does.
            _ => Priority::Optional,
        }
    }
}

/// `Multi-Arch:` (Debian's MultiArch spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MultiArch {
    #[default]
    No,
    Same,
    Foreign,
    Allowed,
}

/// One binary package of an index.
#[derive(Debug, Clone)]
pub struct Package {
    pub name: PackageName,
    pub version: DebVersion,
    pub architecture: Arch,
    pub multi_arch: MultiArch,
    pub essential: bool,
    pub priority: Priority,
    pub depends: Vec<Alternatives>,
    pub pre_depends: Vec<Alternatives>,
    pub recommends: Vec<Alternatives>,
    pub conflicts: Vec<Alternatives>,
    pub breaks: Vec<Alternatives>,
    pub replaces: Vec<Alternatives>,
    /// Each entry is a single relation; `(= v)` makes it a versioned provide.
    pub provides: Vec<Relation>,
    pub filename: String,
    pub size: u64,
    pub sha256: String,
    /// Installed-Size in KiB, when given.
    pub installed_size: Option<u64>,
    /// Index of the repository the package came from (set by the caller).
    pub repository: usize,
}

/// A parsed `Packages` file (or several merged).
#[derive(Debug, Clone, Default)]
pub struct PackagesIndex {
    pub packages: Vec<Package>,
}

impl PackagesIndex {
    /// Parses a decompressed `Packages` file. `file` labels errors; `repository` is stored
    /// in every package.
    pub fn parse(file: &Path, text: &str, repository: usize) -> Result<Self, IndexError> {
        let stanzas = parse_stanzas(file, text)?;
        // Typing the fields (versions, relationship grammar) is most of the cost of a 65k
        // package index: spread it over the cores, chunks in order so the first error and
        // the package order are the same as sequentially.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        let chunk = stanzas.len().div_ceil(threads).max(2048);
        let parts: Vec<Result<Vec<Package>, IndexError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = stanzas
                .chunks(chunk)
                .map(|c| {
                    sc.spawn(move || {
                        c.iter()
                            .map(|s| package_from_stanza(file, s, repository))
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut packages = Vec::with_capacity(stanzas.len());
        for part in parts {
            packages.extend(part?);
        }
        Ok(PackagesIndex { packages })
    }

    pub fn extend(&mut self, other: PackagesIndex) {
        self.packages.extend(other.packages);
    }

    /// Package positions by name.
    pub fn by_name(&self) -> HashMap<&str, Vec<usize>> {
        let mut m: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, p) in self.packages.iter().enumerate() {
            m.entry(p.name.as_str()).or_default().push(i);
        }
        m
    }
}

fn package_from_stanza(
    file: &Path,
    s: &Stanza<'_>,
    repository: usize,
) -> Result<Package, IndexError> {
    let required = |field: &'static str| {
        s.get(field).ok_or_else(|| IndexError::Missing {
            file: file.to_path_buf(),
            line: s.line,
            field,
        })
    };
    let raw_name = required("Package")?;
    let bad = |field: &'static str, message: String| IndexError::Field {
        file: file.to_path_buf(),
        line: s.line_of(field),
        package: raw_name.to_string(),
        field,
        message,
    };
    let name = PackageName::new(raw_name).map_err(|e| bad("Package", e.to_string()))?;
    let version =
        DebVersion::parse(required("Version")?).map_err(|e| bad("Version", e.to_string()))?;
    let architecture =
        Arch::new(required("Architecture")?).map_err(|e| bad("Architecture", e.to_string()))?;
    let rel = |field: &'static str| -> Result<Vec<Alternatives>, IndexError> {
        match s.get(field) {
            None => Ok(Vec::new()),
            Some(v) => parse_relations(v).map_err(|e| bad(field, e.reason)),
        }
    };
    let provides = rel("Provides")?.into_iter().flatten().collect();
    let size = required("Size")?
        .parse::<u64>()
        .map_err(|e| bad("Size", format!("expected a byte count: {e}")))?;
    let sha256 = required("SHA256")?;
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("SHA256", "expected 64 hex digits".into()));
    }
    let multi_arch = match s.get("Multi-Arch") {
        Some("same") => MultiArch::Same,
        Some("foreign") => MultiArch::Foreign,
        Some("allowed") => MultiArch::Allowed,
        _ => MultiArch::No,
    };
    Ok(Package {
        version,
        architecture,
        multi_arch,
        essential: s.get("Essential") == Some("yes"),
        priority: Priority::parse(s.get("Priority").unwrap_or("optional")),
        depends: rel("Depends")?,
        pre_depends: rel("Pre-Depends")?,
        recommends: rel("Recommends")?,
        conflicts: rel("Conflicts")?,
        breaks: rel("Breaks")?,
        replaces: rel("Replaces")?,
        provides,
        filename: required("Filename")?.to_string(),
        size,
        sha256: sha256.to_ascii_lowercase(),
        installed_size: s.get("Installed-Size").and_then(|v| v.parse().ok()),
        repository,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Package: mawk\nVersion: 1.3.4.20200120-3.1\nArchitecture: amd64\nPriority: required\nEssential: no\nMulti-Arch: foreign\nPre-Depends: libc6 (>= 2.14)\nProvides: awk\nFilename: pool/main/m/mawk/mawk_1.3.4.20200120-3.1_amd64.deb\nSize: 119236\nSHA256: 0c1f20b54d7d8a2ab7d6b9e7f6e0f7c2e8e6c0d1c3e3b6c7d1a1b7c2e3f4a5b6\n\nPackage: bash\nVersion: 5.2.15-2+b2\nArchitecture: amd64\nEssential: yes\nPriority: required\nDepends: base-files (>= 2.1.12), debianutils (>= 5.6-0.1)\nFilename: pool/main/b/bash/bash_5.2.15-2+b2_amd64.deb\nSize: 1491660\nSHA256: 1c1f20b54d7d8a2ab7d6b9e7f6e0f7c2e8e6c0d1c3e3b6c7d1a1b7c2e3f4a5b6\n";

    #[test]
    fn parses_real_looking_stanzas() {
        let idx = PackagesIndex::parse(Path::new("Packages"), SAMPLE, 3).unwrap();
        assert_eq!(idx.packages.len(), 2);
        let m = &idx.packages[0];
        assert_eq!(m.multi_arch, MultiArch::Foreign);
        assert_eq!(m.provides[0].name.as_str(), "awk");
        assert!(!m.essential && idx.packages[1].essential);
        assert_eq!(idx.packages[1].depends.len(), 2);
        assert_eq!(idx.packages[1].repository, 3);
    }

    #[test]
    fn truncated_index_names_file_line_and_field() {
        let cut = &SAMPLE[..SAMPLE.find("Filename: pool/main/b").unwrap()];
        let e = PackagesIndex::parse(Path::new("Packages"), cut, 0).unwrap_err();
        assert!(e.to_string().contains("Packages:13"), "{e}");
        assert!(e.to_string().contains("package stanza has no `"), "{e}");
        let bad = SAMPLE.replace("Size: 119236", "Size: many");
        let e = PackagesIndex::parse(Path::new("P"), &bad, 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("P:10: field `Size` of package `mawk`"),
            "{e}"
        );
    }
}
