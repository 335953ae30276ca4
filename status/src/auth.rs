//! Who may read the page: anyone on this machine when it listens on loopback and serves the
//! caller's own state DB; on any other address, or for a DB another account owns, only a
//! client presenting the token, in an `Authorization: Bearer …` header or in the page's
//! cookie (set by `POST /login`, from a form or from the `#token=…` fragment the login page
//! reads: a token never travels in a URL a proxy or a history could keep). Tokens are
//! compared in constant time, through their SHA-256 digests so that the length leaks
//! nothing either.
//!
//! Every request must also name this server in its `Host` header (an IP literal, or
//! `localhost` or this machine's name): a page from another site whose DNS name was rebound
//! to this address names its own host, and is refused.

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

    /// The cookie's value: the digest in hex, so the secret itself is never stored by the
    /// browser and the value needs no quoting.
    pub fn cookie_value(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn matches_cookie(&self, value: &str) -> bool {
        let v = value.as_bytes();
        v.len() == 64 && self.cookie_value().as_bytes().ct_eq(v).into()
    }

    /// Whether a request with these headers presents the token.
    pub fn admits(&self, authorization: Option<&str>, cookie: Option<&str>) -> bool {
        if let Some(t) = authorization.and_then(|h| h.strip_prefix("Bearer ")) {
            return self.matches(t.trim());
        }
        cookie
            .into_iter()
            .flat_map(|c| c.split(';'))
            .filter_map(|kv| {
                kv.trim()
                    .strip_prefix(COOKIE)
                    .and_then(|r| r.strip_prefix('='))
            })
            .any(|v| self.matches_cookie(v.trim()))
    }
}

/// The page's cookie.
pub const COOKIE: &str = "vse_status";

/// Whether `host` (a `Host` header) names this server bound at `bound`: an IP literal (no
/// DNS name, nothing to rebind), `localhost` when it listens there, or this machine's name.
pub fn host_allowed(host: &str, bound: SocketAddr) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, _)) => ip,
            None => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let ip = bound.ip();
    if name == "localhost" || name.ends_with(".localhost") {
        return ip.is_loopback() || ip.is_unspecified();
    }
    machine_name().is_some_and(|m| m.eq_ignore_ascii_case(&name))
}

fn machine_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(text.trim().to_string()).filter(|s| !s.is_empty())
}

/// The `token` field of an `application/x-www-form-urlencoded` body.
pub fn form_token(body: &[u8]) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    let raw = body.split('&').find_map(|kv| kv.strip_prefix("token="))?;
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
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

/// A DB another account owns needs a token even on loopback: without one, every local user
/// could read through the page what only the caller can read in the file.
pub fn require_token_for_foreign_db(db: &Path, token: Option<&Token>) -> Result<(), StatusError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(db)
        .map_err(|e| StatusError::Invalid(format!("state database {}: {e}", db.display())))?;
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if token.is_some() || meta.uid() == me {
        return Ok(());
    }
    Err(StatusError::Invalid(format!(
        "state database {} belongs to uid {}, not to you (uid {me}): serving it needs          --token-file on every address, loopback included (any local user could read it          through the page otherwise)",
        db.display(),
        meta.uid()
    )))
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
    fn token_from_header_or_cookie_only() {
        let t = Token::new("correct horse battery staple");
        let c = format!("a=b; {COOKIE}={}; x=y", t.cookie_value());
        assert!(t.admits(Some("Bearer correct horse battery staple"), None));
        assert!(t.admits(None, Some(&c)));
        assert!(!t.admits(Some("Bearer wrong"), Some(&c)));
        assert!(!t.admits(
            None,
            Some(&format!("{COOKIE}=correct horse battery staple"))
        ));
        assert!(!t.admits(Some("Basic zzz"), None));
        assert!(!t.admits(None, None));
    }

    #[test]
    fn hosts_that_name_this_server() {
        let lo: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8787".parse().unwrap();
        let ext: SocketAddr = "10.1.2.3:8787".parse().unwrap();
        for h in [
            "127.0.0.1:8787",
            "localhost:8787",
            "localhost",
            "[::1]:8787",
        ] {
            assert!(host_allowed(h, lo), "{h}");
        }
        assert!(!host_allowed("evil.example:8787", lo));
        assert!(!host_allowed("evil.example", any));
        assert!(!host_allowed("localhost:8787", ext));
        assert!(host_allowed("10.1.2.3:8787", ext));
        if let Some(m) = machine_name() {
            assert!(host_allowed(&format!("{m}:8787"), ext));
        }
    }

    #[test]
    fn form_bodies() {
        assert_eq!(form_token(b"token=a%2Bb+c").as_deref(), Some("a+b c"));
        assert_eq!(form_token(b"x=1&token=abc").as_deref(), Some("abc"));
        assert_eq!(form_token(b"token=%zz"), None);
        assert_eq!(form_token(b"nothing"), None);
    }
}
