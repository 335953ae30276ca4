//! Whether a detached signature over a manifest was made by a key of the site's keyrings
//! that may sign today. A signature that verifies is not enough: the key must not be revoked
//! or expired, and a subkey must be bound to its primary key (binding and back signature
//! valid) with the signing flag, and be neither revoked nor expired itself.

use chrono::{DateTime, Utc};
use pgp::composed::{Deserializable, SignedPublicKey, SignedPublicSubKey, StandaloneSignature};
use pgp::packet::{Signature, SignatureType, SubpacketData};
use pgp::types::{KeyDetails, PublicKeyTrait, Tag};
use std::path::PathBuf;

/// Why no signature was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// No signature verifies with any key of the keyrings.
    NoKey,
    /// One does, but its key may not sign (revoked, expired, not a signing key...).
    Unusable(String),
    /// The signature file is not OpenPGP.
    Malformed(String),
}

/// The public keys of the keyring files (armored or binary).
pub fn load(paths: &[PathBuf]) -> Result<Vec<SignedPublicKey>, (PathBuf, String)> {
    let mut keys = Vec::new();
    for p in paths {
        let fail = |m: String| (p.clone(), m);
        let bytes = std::fs::read(p).map_err(|e| fail(e.to_string()))?;
        let parsed: Vec<SignedPublicKey> = if bytes.starts_with(b"-----BEGIN") {
            SignedPublicKey::from_armor_many(&bytes[..])
                .map_err(|e| fail(e.to_string()))?
                .0
                .filter_map(Result::ok)
                .collect()
        } else {
            SignedPublicKey::from_bytes_many(&bytes[..])
                .map_err(|e| fail(e.to_string()))?
                .filter_map(Result::ok)
                .collect()
        };
        if parsed.is_empty() {
            return Err(fail("no usable OpenPGP public key".into()));
        }
        keys.extend(parsed);
    }
    Ok(keys)
}

/// Accepts `sig` (armored) over `data` when one of its signatures is by a key of `keys`
/// that may sign at `now`.
pub fn verify(
    data: &[u8],
    sig: &[u8],
    keys: &[SignedPublicKey],
    now: DateTime<Utc>,
) -> Result<(), Rejected> {
    let sigs: Vec<StandaloneSignature> = if sig.starts_with(b"-----BEGIN") {
        StandaloneSignature::from_armor_many(sig)
            .map_err(|e| Rejected::Malformed(e.to_string()))?
            .0
            .filter_map(Result::ok)
            .collect()
    } else {
        StandaloneSignature::from_bytes_many(sig)
            .map_err(|e| Rejected::Malformed(e.to_string()))?
            .filter_map(Result::ok)
            .collect()
    };
    let mut why = None;
    for s in &sigs {
        let s = &s.signature;
        if !matches!(s.typ(), Some(SignatureType::Binary | SignatureType::Text)) {
            continue;
        }
        for k in keys {
            let by_primary = s.verify(&k.primary_key, data).is_ok();
            let by_sub = k
                .public_subkeys
                .iter()
                .find(|sub| s.verify(&sub.key, data).is_ok());
            let verdict = match (by_primary, by_sub) {
                (true, _) => {
                    signature_valid(s, now).and_then(|_| primary_may_sign(k, now, true).map(drop))
                }
                (false, Some(sub)) => signature_valid(s, now)
                    .and_then(|_| primary_may_sign(k, now, false).map(drop))
                    .and_then(|_| subkey_may_sign(k, sub, now)),
                (false, None) => continue,
            };
            match verdict {
                Ok(()) => return Ok(()),
                Err(w) => {
                    why = Some(format!("{}: {w}", fingerprint(k)));
                }
            }
        }
    }
    Err(why.map_or(Rejected::NoKey, Rejected::Unusable))
}

fn fingerprint(k: &SignedPublicKey) -> String {
    format!("key {}", k.primary_key.fingerprint())
}

fn signature_valid(s: &Signature, now: DateTime<Utc>) -> Result<(), String> {
    let Some(created) = s.created() else {
        return Err("the signature has no creation time".into());
    };
    if let Some(exp) = s.signature_expiration_time()
        && !exp.is_zero()
        && *created + *exp <= now
    {
        return Err(format!("the signature expired on {}", *created + *exp));
    }
    Ok(())
}

/// The newest of `sigs` (by creation time).
fn newest<'a>(sigs: impl Iterator<Item = &'a Signature>) -> Option<&'a Signature> {
    sigs.max_by_key(|s| s.created().copied())
}

fn has_key_flags(s: &Signature) -> bool {
    s.config().is_some_and(|c| {
        c.hashed_subpackets
            .iter()
            .any(|p| matches!(p.data, SubpacketData::KeyFlags(_)))
    })
}

/// The primary key is not revoked, has a valid self-signature and has not expired; when it
/// signed the data itself (`signs`), its self-signature's key flags (if any) allow signing.
fn primary_may_sign(k: &SignedPublicKey, now: DateTime<Utc>, signs: bool) -> Result<(), String> {
    let pk = &k.primary_key;
    let revoked = k
        .details
        .revocation_signatures
        .iter()
        .any(|r| r.typ() == Some(SignatureType::KeyRevocation) && r.verify_key(pk).is_ok());
    if revoked {
        return Err("the key is revoked".into());
    }
    let user_sigs = k.details.users.iter().flat_map(|u| {
        u.signatures
            .iter()
            .filter(move |s| s.verify_certification(pk, Tag::UserId, &u.id).is_ok())
    });
    let direct = k
        .details
        .direct_signatures
        .iter()
        .filter(|s| s.verify_key(pk).is_ok());
    let Some(self_sig) = newest(user_sigs.chain(direct)) else {
        return Err("the key has no valid self-signature".into());
    };
    if let Some(exp) = self_sig.key_expiration_time()
        && !exp.is_zero()
        && *pk.created_at() + *exp <= now
    {
        return Err(format!("the key expired on {}", *pk.created_at() + *exp));
    }
    if signs && has_key_flags(self_sig) && !self_sig.key_flags().sign() {
        return Err("the key's flags do not allow signing".into());
    }
    Ok(())
}

/// The subkey is bound to `k` by a valid binding with the signing flag and a valid back
/// signature, is not revoked and has not expired.
fn subkey_may_sign(
    k: &SignedPublicKey,
    sub: &SignedPublicSubKey,
    now: DateTime<Utc>,
) -> Result<(), String> {
    let pk = &k.primary_key;
    let revoked = sub.signatures.iter().any(|r| {
        r.typ() == Some(SignatureType::SubkeyRevocation)
            && r.verify_subkey_binding(pk, &sub.key).is_ok()
    });
    if revoked {
        return Err(format!("subkey {} is revoked", sub.key.fingerprint()));
    }
    let bindings = sub.signatures.iter().filter(|b| {
        b.typ() == Some(SignatureType::SubkeyBinding)
            && b.verify_subkey_binding(pk, &sub.key).is_ok()
    });
    let Some(binding) = newest(bindings) else {
        return Err(format!(
            "subkey {} has no valid binding to its primary key",
            sub.key.fingerprint()
        ));
    };
    if !binding.key_flags().sign() {
        return Err(format!(
            "subkey {} is not a signing subkey (its binding lacks the signing flag)",
            sub.key.fingerprint()
        ));
    }
    let back = binding
        .embedded_signature()
        .is_some_and(|b| b.verify_primary_key_binding(&sub.key, pk).is_ok());
    if !back {
        return Err(format!(
            "subkey {} has no valid back signature",
            sub.key.fingerprint()
        ));
    }
    if let Some(exp) = binding.key_expiration_time()
        && !exp.is_zero()
        && *sub.key.created_at() + *exp <= now
    {
        return Err(format!(
            "subkey {} expired on {}",
            sub.key.fingerprint(),
            *sub.key.created_at() + *exp
        ));
    }
    Ok(())
}
