//! Whether an image may run under the policy stack in force now. Asked at every launch, not
//! only when the image was made: the site's rules may have changed since (a package forbidden
//! later, a signature now required), and an image directory can come from anywhere.
//!
//! The answer comes from the image's manifest: the packages with their versions, the files
//! and users the builder wrote, or, for an imported image, what its dpkg database listed.
//! When a policy asks for it (`images.signed_by`), the manifest must carry a detached
//! OpenPGP signature (`manifest.json.asc`) by a key of one of the keyrings each such policy
//! lists, and every part must match the digest the signed manifest records, so a site can
//! make its build service the only source of images.

mod admitted;
mod keycheck;

pub use admitted::{Admitted, MAX_MANIFEST, Readers};

use crate::merge::Stack;
use crate::merge::images::{ImageFacts, InstalledPackage, check_imported, package_rules};
use crate::units::AbsPath;
use crate::yaml::{Diagnostic, Diagnostics, SrcPos};
use chrono::SubsecRound as _;
use std::path::{Path, PathBuf};
use vse_image::manifest::Manifest;

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
    #[error("{at}: images.signed_by: keyring {}: {message}", .path.display())]
    Keyring {
        at: SrcPos,
        path: PathBuf,
        message: String,
    },
    #[error(
        "{}: its signature is by a key of {keyrings} ({at}: images.signed_by) that may not sign: {why}",
        .image.display()
    )]
    UnusableKey {
        image: PathBuf,
        at: SrcPos,
        keyrings: String,
        why: String,
    },
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
    #[error("{}: larger than {max} bytes; not an image manifest or signature", .path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error(transparent)]
    Image(#[from] vse_image::ImageError),
    #[error("cannot copy the admitted image into {}: {source}", .dir.display())]
    Store {
        dir: PathBuf,
        source: std::io::Error,
    },
}

impl vse_exit::Classify for AdmitError {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            // A path the user gave that is no image (a file, a loop, missing) is theirs to fix.
            AdmitError::Read { source, .. } if vse_base::is_users_path_error(source) => {
                vse_exit::ErrorKind::InvalidInput
            }
            AdmitError::Read { .. } | AdmitError::Store { .. } => vse_exit::ErrorKind::Internal,
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

/// Checks the image in `dir` against the stack `st`, on one read of its manifest and parts
/// (see [`Admitted`]). `_manifest` is what the caller opened: the rules run on this function's
/// own read, the one the signature is checked over. A caller that then boots the image must
/// boot what [`Admitted::publish`] copies, not the directory.
pub fn admit(dir: &Path, _manifest: &Manifest, st: &Stack) -> Result<(), AdmitError> {
    let a = Admitted::open(dir)?;
    a.check(st)?;
    if !st.images.signed_by.is_empty() {
        a.verify_parts()?;
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

/// The detached `signature` (None: there is none) of `manifest` is by a key of `keyrings`.
fn check_signature(
    dir: &Path,
    manifest: &[u8],
    signature: Option<&[u8]>,
    keyrings: &[AbsPath],
    at: &SrcPos,
) -> Result<(), AdmitError> {
    let paths: Vec<PathBuf> = keyrings.iter().map(|k| PathBuf::from(k.as_str())).collect();
    let keys = keycheck::load(&paths).map_err(|(path, message)| AdmitError::Keyring {
        at: at.clone(),
        path,
        message,
    })?;
    let names = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(sig) = signature else {
        return Err(AdmitError::Unsigned {
            image: dir.to_path_buf(),
            at: at.clone(),
            keyrings: names,
        });
    };
    match keycheck::verify(manifest, sig, &keys, chrono::Utc::now()) {
        Ok(()) => Ok(()),
        Err(keycheck::Rejected::Unusable(why)) => Err(AdmitError::UnusableKey {
            image: dir.to_path_buf(),
            at: at.clone(),
            keyrings: names,
            why,
        }),
        Err(keycheck::Rejected::NoKey | keycheck::Rejected::Malformed(_)) => {
            Err(AdmitError::BadSignature {
                image: dir.to_path_buf(),
                at: at.clone(),
                keyrings: names,
            })
        }
    }
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
    /// The image does not match its manifest: signing it would vouch for parts nobody built.
    #[error("refusing to sign: {0}")]
    Image(#[from] Box<AdmitError>),
}

impl vse_exit::Classify for SignError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// Signs the manifest of the image in `dir` with the armored secret key at `key` (no
/// passphrase: a build service's key lives in a file only it can read), writing
/// [`SIGNATURE`]. Every part is first checked against the manifest, and the signature is made
/// over the bytes of that same read. Returns the signature's path.
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
    let admitted = Admitted::open(dir).map_err(Box::new)?;
    admitted.verify_parts().map_err(Box::new)?;
    let manifest = admitted.manifest_bytes();
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
        .sign(k, &Password::empty(), manifest)
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
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(armored.as_bytes()))
            .map_err(|e| write(&tmp, e))?;
    }
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
