//! OpenPGP verification of `InRelease` (cleartext-signed) and `Release` + `Release.gpg`
//! (detached) against a keyring, with rPGP (pure Rust: no gpgv, nettle or libclang needed).

use pgp::composed::{CleartextSignedMessage, Deserializable, SignedPublicKey, StandaloneSignature};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read keyring {path}: {source}")]
    KeyringRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("keyring {path} holds no usable OpenPGP public key{detail}")]
    KeyringEmpty { path: PathBuf, detail: String },
    #[error("{what}: not an OpenPGP signed file: {message}")]
    Malformed { what: String, message: String },
    #[error(
        "{what}: BAD SIGNATURE: no signature verifies against the keyring(s) {keyrings} (tampered file, or signed by a key you do not trust; add its keyring with `signed-by`)"
    )]
    Bad { what: String, keyrings: String },
}

/// The public keys of one or more keyrings (binary `.gpg` with keys concatenated, or armored).
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<SignedPublicKey>,
    paths: Vec<PathBuf>,
}

impl Keyring {
    pub fn load(paths: &[PathBuf]) -> Result<Keyring, VerifyError> {
        let mut ring = Keyring::default();
        for p in paths {
            let bytes = std::fs::read(p).map_err(|source| VerifyError::KeyringRead {
                path: p.clone(),
                source,
            })?;
            let keys = parse_keys(&bytes).map_err(|detail| VerifyError::KeyringEmpty {
                path: p.clone(),
                detail: format!(": {detail}"),
            })?;
            if keys.is_empty() {
                return Err(VerifyError::KeyringEmpty {
                    path: p.clone(),
                    detail: String::new(),
                });
            }
            ring.keys.extend(keys);
            ring.paths.push(p.clone());
        }
        Ok(ring)
    }

    /// Adds keys given inline (apt's `Signed-By:` with an armored block).
    pub fn add_armored(&mut self, label: &Path, text: &str) -> Result<(), VerifyError> {
        let keys = parse_keys(text.as_bytes()).map_err(|detail| VerifyError::KeyringEmpty {
            path: label.to_path_buf(),
            detail: format!(": {detail}"),
        })?;
        self.keys.extend(keys);
        self.paths.push(label.to_path_buf());
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn describe(&self) -> String {
        let v: Vec<String> = self.paths.iter().map(|p| p.display().to_string()).collect();
        v.join(", ")
    }

    /// Tries every primary key and subkey: Debian signs with primary keys, other archives
    /// often with signing subkeys.
    fn any_verifies(&self, content: &[u8], sigs: &[StandaloneSignature]) -> bool {
        sigs.iter().any(|s| {
            self.keys.iter().any(|k| {
                s.verify(k, content).is_ok()
                    || k.public_subkeys
                        .iter()
                        .any(|sub| s.verify(sub, content).is_ok())
            })
        })
    }
}

fn parse_keys(bytes: &[u8]) -> pgp::errors::Result<Vec<SignedPublicKey>> {
    let armored = bytes.starts_with(b"-----BEGIN");
    let iter: Box<dyn Iterator<Item = pgp::errors::Result<SignedPublicKey>>> = if armored {
        SignedPublicKey::from_armor_many(bytes)?.0
    } else {
        SignedPublicKey::from_bytes_many(bytes)?
    };
    // Keys this library cannot parse (obsolete algorithms) are skipped, like gpgv does.
    Ok(iter.filter_map(Result::ok).collect())
}

/// Verifies a cleartext-signed `InRelease`; returns the signed text (the Release content).
pub fn verify_inrelease(what: &str, text: &str, ring: &Keyring) -> Result<String, VerifyError> {
    let (msg, _) =
        CleartextSignedMessage::from_string(text).map_err(|e| VerifyError::Malformed {
            what: what.to_string(),
            message: e.to_string(),
        })?;
    let signed = msg.signed_text();
    let ok = ring.any_verifies(signed.as_bytes(), msg.signatures());
    if !ok {
        return Err(VerifyError::Bad {
            what: what.to_string(),
            keyrings: ring.describe(),
        });
    }
    // The Release content is the dash-unescaped text; signed_text() has CRLF line ends.
    Ok(signed.replace("\r\n", "\n"))
}

/// Verifies `Release` against a detached, armored `Release.gpg`.
pub fn verify_detached(
    what: &str,
    content: &[u8],
    signature: &[u8],
    ring: &Keyring,
) -> Result<(), VerifyError> {
    let (sigs, _) =
        StandaloneSignature::from_armor_many(signature).map_err(|e| VerifyError::Malformed {
            what: format!("{what}.gpg"),
            message: e.to_string(),
        })?;
    let sigs: Vec<StandaloneSignature> = sigs.filter_map(Result::ok).collect();
    if ring.any_verifies(content, &sigs) {
        Ok(())
    } else {
        Err(VerifyError::Bad {
            what: what.to_string(),
            keyrings: ring.describe(),
        })
    }
}
