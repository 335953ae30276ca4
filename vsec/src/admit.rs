//! Whether an image may run under the policy stack in force now. Asked at every launch, not
//! only when the image was made: the site's rules may have changed since (a package forbidden
//! later, a signature now required), and an image directory can come from anywhere.
//!
//! The answer comes from the image's manifest: the packages with their versions, the files
//! and users the builder wrote, or, for an imported image, what its dpkg database listed.
//! When a policy asks for it (`images.signed_by`), the manifest must carry a detached
//! OpenPGP signature (`manifest.json.asc`) by a key of each listed keyring, and every part
//! must match the digest the signed manifest records, so a site can make its build service
//! the only source of images.

use crate::merge::Stack;
use crate::merge::images::{ImageFacts, InstalledPackage, check_imported, package_rules};
use crate::repo::verify::{Keyring, VerifyError, verify_detached};
use crate::units::AbsPath;
use crate::yaml::{Diagnostic, Diagnostics, SrcPos};
use chrono::SubsecRound as _;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use vse_image::manifest::{MANIFEST, Manifest};

/// The detached, armored signature of `manifest.json`, next to it.
pub const SIGNATURE: &str = "manifest.json.asc";

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("{}: refused by the site's policies:\n{problems}", .image.display())]
    Refused {
        image: PathBuf,
        problems: Diagnostics,
    },
    #[error(
        "{}: no signature ({SIGNATURE}), but {at} demands one by a key of {keyrings}; hint: have the site's build service sign it (`vse sign`)",
        .image.display()
    )]
    Unsigned {
        image: PathBuf,
        at: SrcPos,
        keyrings: String,
    },
    #[error(
        "{}: its signature is not by a key of {keyrings} ({at}: images.signed_by), or the manifest changed since it was signed",
        .image.display()
    )]
    BadSignature {
        image: PathBuf,
        at: SrcPos,
        keyrings: String,
    },
    #[error("{at}: images.signed_by: {source}")]
    Keyring { at: SrcPos, source: VerifyError },
    #[error(
        "{}: part `{part}` does not match the signed manifest (sha256 {actual}, manifest says {expected}); the image was changed after signing",
        .image.display()
    )]
    Tampered {
        image: PathBuf,
        part: String,
        expected: String,
        actual: String,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl vse_exit::Classify for AdmitError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            AdmitError::Read { .. } => vse_exit::ErrorKind::Internal,
            _ => vse_exit::ErrorKind::InvalidInput,
        }
    }
}

/// What the builder wrote into an image, from its manifest's steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuiltFacts {
    /// Files from the spec (`file /etc/x`).
    pub files: Vec<String>,
    /// Files a policy required (`policy file /etc/x`).
    pub policy_files: Vec<String>,
    /// Users with the uid the spec gave them (`user NAME uid N`).
    pub users: Vec<(String, Option<u32>)>,
}

/// Checks the image in `dir` (its `manifest`, already read) against the stack `st`.
pub fn admit(dir: &Path, manifest: &Manifest, st: &Stack) -> Result<(), AdmitError> {
    let problems = problems(&dir.display().to_string(), manifest, st);
    if !problems.is_empty() {
        return Err(AdmitError::Refused {
            image: dir.to_path_buf(),
            problems: problems.sorted(),
        });
    }
    for rule in &st.images.signed_by {
        check_signature(dir, &rule.value, &rule.at)?;
    }
    if !st.images.signed_by.is_empty() {
        check_parts(dir, manifest)?;
    }
    Ok(())
}

/// Every rule of `st` the manifest shows the image breaks.
pub fn problems(source: &str, m: &Manifest, st: &Stack) -> Diagnostics {
    match (&m.provenance, &m.imported) {
        (Some(p), None) => {
            let installed: Vec<InstalledPackage> = (p.packages.iter())
                .map(|p| InstalledPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                    architecture: String::new(),
                })
                .collect();
            let steps: Vec<&str> = p.steps.iter().map(|s| s.what.as_str()).collect();
            let mut d = Diagnostics::default();
            package_rules(&mut d, st, source, &installed);
            built_rules(&mut d, st, source, &built_facts(&steps));
            d
        }
        (_, Some(imp)) => check_imported(
            st,
            &ImageFacts {
                dpkg_database: imp.dpkg_database,
                installed: (imp.installed.iter())
                    .map(|p| InstalledPackage {
                        name: p.name.clone(),
                        version: p.version.clone(),
                        architecture: p.architecture.clone(),
                    })
                    .collect(),
                source: format!("{source} (imported from {})", imp.source),
            },
        ),
        // Not made by `vse build` (assembled by hand, or older): it is held to the rules of
        // an imported image that has no package database.
        (None, None) => check_imported(
            st,
            &ImageFacts {
                dpkg_database: false,
                installed: vec![],
                source: format!("{source} (not built by vse: its manifest has no provenance)"),
            },
        ),
    }
}

/// The files and users of a built image's steps (see `imgbuild::customize`).
pub fn built_facts(steps: &[&str]) -> BuiltFacts {
    let mut f = BuiltFacts::default();
    for s in steps {
        if let Some(p) = s.strip_prefix("policy file ") {
            f.policy_files.push(p.to_string());
        } else if let Some(p) = s.strip_prefix("file ") {
            f.files.push(p.to_string());
        } else if let Some(u) = s.strip_prefix("user ") {
            let (name, uid) = match u.split_once(" uid ") {
                Some((n, id)) => (n, id.parse().ok()),
                None => (u, None),
            };
            f.users.push((name.to_string(), uid));
        }
    }
    f
}

/// Protected paths the spec wrote into, required files the image lacks, users outside the
/// uid range.
fn built_rules(d: &mut Diagnostics, st: &Stack, source: &str, f: &BuiltFacts) {
    for file in &f.files {
        let Ok(path) = AbsPath::parse(file) else {
            continue;
        };
        if let Some(p) = st.protected_paths.iter().find(|p| path.is_within(&p.value)) {
            d.push(
                Diagnostic::new(
                    p.at.clone(),
                    format!(
                        "{source} writes {file}, inside the protected path {}",
                        p.value
                    ),
                )
                .hint("rebuild the image from its spec without that file"),
            );
        }
    }
    for r in &st.required_files {
        let want = r.value.path.to_string();
        if !f.policy_files.contains(&want) {
            d.push(
                Diagnostic::new(
                    r.at.clone(),
                    format!("{source} lacks the file {want} the policy requires"),
                )
                .hint("rebuild the image under the current policies (`vse build SPEC`)"),
            );
        }
    }
    if let Some(range) = &st.uid_range {
        for (name, uid) in &f.users {
            if let Some(uid) = uid.filter(|u| !range.value.contains(*u)) {
                d.push(
                    Diagnostic::new(
                        range.at.clone(),
                        format!(
                            "{source} has user {name} with uid {uid}, outside users.uid_range {}",
                            range.value
                        ),
                    )
                    .hint("rebuild the image with a uid inside the range"),
                );
            }
        }
    }
}

fn check_signature(dir: &Path, keyrings: &[AbsPath], at: &SrcPos) -> Result<(), AdmitError> {
    let paths: Vec<PathBuf> = keyrings.iter().map(|k| PathBuf::from(k.as_str())).collect();
    let ring = Keyring::load(&paths).map_err(|source| AdmitError::Keyring {
        at: at.clone(),
        source,
    })?;
    let names = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sig_path = dir.join(SIGNATURE);
    let sig = match std::fs::read(&sig_path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AdmitError::Unsigned {
                image: dir.to_path_buf(),
                at: at.clone(),
                keyrings: names,
            });
        }
        Err(source) => {
            return Err(AdmitError::Read {
                path: sig_path,
                source,
            });
        }
    };
    let manifest_path = dir.join(MANIFEST);
    let manifest = std::fs::read(&manifest_path).map_err(|source| AdmitError::Read {
        path: manifest_path,
        source,
    })?;
    verify_detached(MANIFEST, &manifest, &sig, &ring).map_err(|_| AdmitError::BadSignature {
        image: dir.to_path_buf(),
        at: at.clone(),
        keyrings: names,
    })
}

/// Every part hashes to what the (signed) manifest says.
fn check_parts(dir: &Path, m: &Manifest) -> Result<(), AdmitError> {
    for (name, part) in &m.parts {
        let path = dir.join(&part.file);
        let mut f = std::fs::File::open(&path).map_err(|source| AdmitError::Read {
            path: path.clone(),
            source,
        })?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(|source| AdmitError::Read {
            path: path.clone(),
            source,
        })?;
        let actual = hex::encode(h.finalize());
        if actual != part.sha256 {
            return Err(AdmitError::Tampered {
                image: dir.to_path_buf(),
                part: name.clone(),
                expected: part.sha256.clone(),
                actual,
            });
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("{}: not an armored OpenPGP secret key: {message}", .path.display())]
    Key { path: PathBuf, message: String },
    #[error("cannot sign with {}: {message}", .path.display())]
    Sign { path: PathBuf, message: String },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl vse_exit::Classify for SignError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// Signs the manifest of the image in `dir` with the armored secret key at `key` (no
/// passphrase: a build service's key lives in a file only it can read), writing
/// [`SIGNATURE`]. Returns the signature's path.
pub fn sign(dir: &Path, key: &Path) -> Result<PathBuf, SignError> {
    use pgp::composed::{ArmorOptions, Deserializable, SignedSecretKey, StandaloneSignature};
    use pgp::packet::{SignatureConfig, SignatureType, Subpacket, SubpacketData};
    use pgp::types::{KeyDetails, KeyVersion, Password};
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| SignError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let key_text = read(key)?;
    let bad_key = |e: pgp::errors::Error| SignError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    };
    let (secret, _) = SignedSecretKey::from_armor_single(&key_text[..]).map_err(bad_key)?;
    let manifest = read(&dir.join(MANIFEST))?;
    let failed = |e: pgp::errors::Error| SignError::Sign {
        path: key.to_path_buf(),
        message: e.to_string(),
    };
    let k = &secret.primary_key;
    let mut rng = rand::thread_rng();
    let mut config =
        SignatureConfig::from_key(&mut rng, k, SignatureType::Binary).map_err(failed)?;
    config.hashed_subpackets = vec![
        Subpacket::regular(SubpacketData::IssuerFingerprint(k.fingerprint())).map_err(failed)?,
        Subpacket::regular(SubpacketData::SignatureCreationTime(
            chrono::Utc::now().trunc_subsecs(0),
        ))
        .map_err(failed)?,
    ];
    if k.version() <= KeyVersion::V4 {
        config.unhashed_subpackets =
            vec![Subpacket::regular(SubpacketData::Issuer(k.key_id())).map_err(failed)?];
    }
    let sig = config
        .sign(k, &Password::empty(), &manifest[..])
        .map_err(failed)?;
    let armored = StandaloneSignature::new(sig)
        .to_armored_string(ArmorOptions::default())
        .map_err(failed)?;
    let out = dir.join(SIGNATURE);
    let tmp = dir.join(format!(".{SIGNATURE}.tmp"));
    let write = |path: &Path, source| SignError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, armored).map_err(|e| write(&tmp, e))?;
    std::fs::rename(&tmp, &out).map_err(|e| write(&out, e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_give_files_policy_files_and_users() {
        let f = built_facts(&[
            "guest agent",
            "file /etc/motd",
            "user alice uid 20001",
            "user bob",
            "post-install 1",
            "policy file /etc/vse/site",
        ]);
        assert_eq!(f.files, ["/etc/motd"]);
        assert_eq!(f.policy_files, ["/etc/vse/site"]);
        assert_eq!(
            f.users,
            [
                ("alice".to_string(), Some(20001)),
                ("bob".to_string(), None)
            ]
        );
    }
}
