//! Who may read the page: anyone on this machine when it listens on loopback, and on any
//! other address only a client presenting the token (`Authorization: Bearer …` or
//! `?token=…`, which the page passes on to its own requests). Tokens are compared in
//! constant time, through their SHA-256 digests so that the length leaks nothing either.

use crate::StatusError;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Shortest token accepted: guessing must be hopeless.
pub const MIN_TOKEN: usize = 16;

#[derive(Clone)]
pub struct Token([u8; 32]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    pub fn new(secret: &str) -> Self {
        Token(Sha256::digest(secret.as_bytes()).into())
    }

    /// The first line of a file only its owner can read.
    pub fn from_file(path: &Path) -> Result<Self, StatusError> {
        use std::os::unix::fs::PermissionsExt;
        let bad =
            |why: String| StatusError::Invalid(format!("--token-file {}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(bad(
                "group or others can read it; hint: chmod 600 (a token others can read \
                 protects nothing)"
                    .into(),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let secret = text.lines().next().unwrap_or("").trim();
        if secret.len() < MIN_TOKEN {
            return Err(bad(format!(
                "the token must be at least {MIN_TOKEN} characters; hint: \
                 head -c 24 /dev/urandom | base64 > FILE"
            )));
        }
        Ok(Token::new(secret))
    }

    pub fn matches(&self, presented: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.0.ct_eq(&d).into()
    }
}

/// A routable address needs a token: nothing listens unauthenticated beyond this machine.
pub fn require_token_off_loopback(
    addr: SocketAddr,
    token: Option<&Token>,
) -> Result<(), StatusError> {
    if addr.ip().is_loopback() || token.is_some() {
        return Ok(());
    }
    Err(StatusError::Invalid(format!(
        "--serve {addr}: an address other than loopback needs --token-file (anyone who can \
         reach it could read the cluster's state); hint: --serve 127.0.0.1:PORT and an SSH \
         tunnel, or a token file"
    )))
}

/// The token a request presents: its `Authorization: Bearer` header, else its `token` query
/// parameter (already decoded).
pub fn presented<'a>(authorization: Option<&'a str>, query: Option<&'a str>) -> Option<&'a str> {
    authorization
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .or(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_exactly() {
        let t = Token::new("correct horse battery staple");
        assert!(t.matches("correct horse battery staple"));
        assert!(!t.matches("correct horse battery stapl"));
        assert!(!t.matches(""));
    }

    #[test]
    fn routable_addresses_need_a_token() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let lo6: SocketAddr = "[::1]:0".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(require_token_off_loopback(lo, None).is_ok());
        assert!(require_token_off_loopback(lo6, None).is_ok());
        let e = require_token_off_loopback(any, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--token-file"), "{e}");
        assert!(
            require_token_off_loopback(any, Some(&Token::new("x".repeat(20).as_str()))).is_ok()
        );
    }

    #[test]
    fn token_files_must_be_private_and_long() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("token");
        std::fs::write(&f, "0123456789abcdefXYZ\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Token::from_file(&f)
                .unwrap_err()
                .to_string()
                .contains("chmod 600")
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::from_file(&f).unwrap().matches("0123456789abcdefXYZ"));
        std::fs::write(&f, "short\n").unwrap();
        assert!(
            Token::from_file(&f)
                .unwrap_err()
                .to_string()
                .contains("at least")
        );
    }

    #[test]
    fn token_from_header_or_query() {
        assert_eq!(presented(Some("Bearer abc"), None), Some("abc"));
        assert_eq!(presented(None, Some("def")), Some("def"));
        assert_eq!(presented(Some("Basic zzz"), None), None);
    }
}
