//! The `SOURCE` argument of `vse import`: `KIND:PATH[:REF]`.

use super::ImportError;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A tar of an OCI image layout (`skopeo copy … oci-archive:FILE`).
    OciArchive,
    /// An OCI image layout directory.
    Oci,
    /// `docker save` output.
    DockerArchive,
    /// A root file system tarball, optionally gzip/zstd/xz-compressed: one layer.
    Tar,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::OciArchive => "oci-archive",
            SourceKind::Oci => "oci",
            SourceKind::DockerArchive => "docker-archive",
            SourceKind::Tar => "tar",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub kind: SourceKind,
    pub path: PathBuf,
    /// The image's tag (OCI `ref.name` annotation, Docker `REPO:TAG`).
    pub reference: Option<String>,
    /// As given, for the manifest and messages.
    pub given: String,
}

impl Source {
    /// Parses `KIND:PATH[:REF]`. The path is the longest prefix that exists, so paths and
    /// Docker references (`repo/name:tag`) may both hold colons.
    pub fn parse(s: &str) -> Result<Source, ImportError> {
        let syntax = || ImportError::SourceSyntax { given: s.into() };
        let (kind, rest) = s.split_once(':').ok_or_else(syntax)?;
        let kind = match kind {
            "oci-archive" => SourceKind::OciArchive,
            "oci" => SourceKind::Oci,
            "docker-archive" => SourceKind::DockerArchive,
            "tar" => SourceKind::Tar,
            _ => return Err(syntax()),
        };
        if rest.is_empty() {
            return Err(syntax());
        }
        let (path, reference) = if Path::new(rest).exists() || kind == SourceKind::Tar {
            (rest, None)
        } else {
            let split = rest
                .match_indices(':')
                .map(|(i, _)| i)
                .find(|&i| Path::new(&rest[..i]).exists());
            match split {
                Some(i) if !rest[i + 1..].is_empty() => {
                    (&rest[..i], Some(rest[i + 1..].to_string()))
                }
                _ => (rest, None),
            }
        };
        let path = PathBuf::from(path);
        let ok = match kind {
            SourceKind::Oci => path.is_dir(),
            _ => path.is_file(),
        };
        if !ok {
            return Err(ImportError::NotFound {
                kind: kind.as_str(),
                path,
            });
        }
        Ok(Source {
            kind,
            path,
            reference,
            given: s.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_paths_and_references() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("img.tar");
        std::fs::write(&f, b"x").unwrap();
        let s = Source::parse(&format!("docker-archive:{}:vse/deb:test", f.display())).unwrap();
        assert_eq!(
            (s.kind, s.path.as_path(), s.reference.as_deref()),
            (SourceKind::DockerArchive, f.as_path(), Some("vse/deb:test"))
        );
        let s = Source::parse(&format!("oci:{}:latest", d.path().display())).unwrap();
        assert_eq!(s.reference.as_deref(), Some("latest"));
        let s = Source::parse(&format!("oci-archive:{}", f.display())).unwrap();
        assert_eq!(s.reference, None);
        assert!(matches!(
            Source::parse("docker:foo"),
            Err(ImportError::SourceSyntax { .. })
        ));
        assert!(matches!(
            Source::parse("tar:/nonexistent/rootfs.tar"),
            Err(ImportError::NotFound { .. })
        ));
    }
}
