//! OpenPGP verification of `InRelease` (cleartext-signed) and `Release` + `Release.gpg`
//! (detached) against a keyring, with rPGP (pure Rust: no gpgv, nettle or libclang needed).

use pgp::composed::{Deserializable, SignedPublicKey, StandaloneSignature};
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
    let malformed = |message: String| VerifyError::Malformed {
        what: what.to_string(),
        message,
    };
    let (lines, armored) = split_cleartext(text).map_err(malformed)?;
    let (sigs, _) = StandaloneSignature::from_armor_many(armored.as_bytes())
        .map_err(|e| malformed(e.to_string()))?;
    let sigs: Vec<StandaloneSignature> = sigs.filter_map(Result::ok).collect();
    if sigs.is_empty() {
        return Err(malformed("no signature after the signed text".into()));
    }
    // What the signatures cover: the lines with CRLF ends, the last one without.
    if !ring.any_verifies(lines.join("\r\n").as_bytes(), &sigs) {
        return Err(VerifyError::Bad {
            what: what.to_string(),
            keyrings: ring.describe(),
        });
    }
    Ok(lines.join("\n"))
}

/// Splits a cleartext-signed message (RFC 9580 §7) into its text lines, dash-unescaped and
/// with trailing blanks removed as the signature covers them, and the armored signature
/// block. Done here in one pass: rPGP's parser rescans its buffer at every line, which on a
/// 150 KB InRelease costs tens of milliseconds per file.
fn split_cleartext(text: &str) -> Result<(Vec<&str>, &str), String> {
    const BEGIN: &str = "-----BEGIN PGP SIGNED MESSAGE-----";
    const SIG: &str = "-----BEGIN PGP SIGNATURE-----";
    let mut rest = text.trim_start_matches(['\r', '\n']);
    rest = rest
        .strip_prefix(BEGIN)
        .and_then(|r| r.split_once('\n'))
        .filter(|(tail, _)| tail.trim().is_empty())
        .ok_or_else(|| format!("does not start with a `{BEGIN}` line"))?
        .1;
    // Armor headers (`Hash: SHA512`) end at the first empty line.
    loop {
        let (line, after) = rest
            .split_once('\n')
            .ok_or("ends inside the armor headers")?;
        rest = after;
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            break;
        }
        if !line.starts_with("Hash:") {
            return Err(format!("unexpected armor header `{line}`"));
        }
    }
    // Dash-escaping guarantees that no text line starts with `-`: the first one that does
    // opens the signature.
    let mut lines = Vec::new();
    let mut pos = 0;
    loop {
        let end = rest[pos..]
            .find('\n')
            .map(|i| pos + i)
            .ok_or("no signature block")?;
        let line = rest[pos..end].trim_end_matches('\r');
        if line.starts_with('-') && !line.starts_with("- ") {
            if !line.starts_with(SIG) {
                return Err(format!("expected `{SIG}`, found `{line}`"));
            }
            return Ok((lines, &rest[pos..]));
        }
        let unescaped = line.strip_prefix("- ").unwrap_or(line);
        lines.push(unescaped.trim_end_matches([' ', '\t']));
        pos = end + 1;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use pgp::composed::{CleartextSignedMessage, KeyType, SecretKeyParamsBuilder};
    use rand::SeedableRng;

    #[test]
    fn own_cleartext_split_agrees_with_rpgp() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let key = SecretKeyParamsBuilder::default()
            .key_type(KeyType::Ed25519Legacy)
            .can_sign(true)
            .primary_user_id("vse test <test@example.org>".into())
            .build()
            .unwrap()
            .generate(&mut rng)
            .unwrap()
            .sign(&mut rng, &"".into())
            .unwrap();
        // (rPGP signs trailing blanks that RFC 9580 says to ignore, so the sample has none.)
        let text = "Origin: test\nDate: x\n-dashed line\n- also\nSHA256:\n 00 1 main/binary-amd64/Packages\nlast";
        let msg =
            CleartextSignedMessage::sign(&mut rng, text, &key.primary_key, &"".into()).unwrap();
        let armored = msg.to_armored_string(Default::default()).unwrap();
        let mut ring = Keyring::default();
        let public = key
            .signed_public_key()
            .to_armored_string(Default::default())
            .unwrap();
        ring.add_armored(Path::new("test"), &public).unwrap();
        let got = verify_inrelease("t", &armored, &ring).unwrap();
        assert_eq!(got, msg.signed_text().replace("\r\n", "\n"));
        assert!(got.contains("\n-dashed line\n- also\n") && got.contains("Date: x\n"));
        let tampered = armored.replace("Origin: test", "Origin: evil");
        assert!(matches!(
            verify_inrelease("t", &tampered, &ring),
            Err(VerifyError::Bad { .. })
        ));
        let unsigned = armored[..armored.find("-----BEGIN PGP SIGNATURE").unwrap()].to_string();
        assert!(matches!(
            verify_inrelease("t", &unsigned, &ring),
            Err(VerifyError::Malformed { .. })
        ));
    }
}
