//! Frame layout: `len:u32 | seq:u64 | json_len:u32 | json | blob | hmac:32`, big endian.
//! The MAC covers the receiver's connection nonce and the frame's direction, then everything
//! from `seq` to the blob's end. The direction makes a frame reflected back to its sender
//! worthless even if both ends' nonces were the same.

use super::ProtoError;
use crate::secret::JobSecret;
use hmac::{Hmac, Mac};
use serde::{Serialize, de::DeserializeOwned};
use sha2::Sha256;

pub const MAX_BLOB: usize = 4 << 20;
pub const MAX_FRAME: usize = MAX_BLOB + (1 << 20);
const TAG: usize = 32;

/// Which way a frame travels on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the end that dialled to the end that accepted.
    ToAcceptor,
    /// From the end that accepted to the end that dialled.
    ToDialer,
}

impl Direction {
    pub fn reverse(self) -> Direction {
        match self {
            Direction::ToAcceptor => Direction::ToDialer,
            Direction::ToDialer => Direction::ToAcceptor,
        }
    }

    fn tag(self) -> &'static [u8] {
        match self {
            Direction::ToAcceptor => b"vse-frame to-acceptor",
            Direction::ToDialer => b"vse-frame to-dialer",
        }
    }
}

fn mac(key: &JobSecret, nonce: &[u8; 16], dir: Direction) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("any key length");
    m.update(dir.tag());
    m.update(nonce);
    m
}

/// Builds a whole frame (length prefix included).
pub fn encode_frame<M: Serialize>(
    key: &JobSecret,
    peer_nonce: &[u8; 16],
    dir: Direction,
    seq: u64,
    msg: &M,
    blob: &[u8],
) -> Result<Vec<u8>, ProtoError> {
    let json = serde_json::to_vec(msg).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    let len = 8 + 4 + json.len() + blob.len() + TAG;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(blob);
    let mut m = mac(key, peer_nonce, dir);
    m.update(&out[4..]);
    out.extend_from_slice(&m.finalize().into_bytes());
    Ok(out)
}

/// Checks and decodes a frame body (without the length prefix). Returns (seq, msg, blob).
pub fn decode_frame<M: DeserializeOwned>(
    key: &JobSecret,
    my_nonce: &[u8; 16],
    dir: Direction,
    body: &[u8],
) -> Result<(u64, M, Vec<u8>), ProtoError> {
    if body.len() < 12 + TAG {
        return Err(ProtoError::Malformed(format!(
            "{} bytes is shorter than a header",
            body.len()
        )));
    }
    let (signed, tag) = body.split_at(body.len() - TAG);
    let mut m = mac(key, my_nonce, dir);
    m.update(signed);
    // Verify before parsing anything: unauthenticated bytes never reach the JSON decoder.
    m.verify_slice(tag).map_err(|_| ProtoError::BadMac)?;
    let seq = u64::from_be_bytes(signed[0..8].try_into().expect("8 bytes"));
    let json_len = u32::from_be_bytes(signed[8..12].try_into().expect("4 bytes")) as usize;
    let rest = &signed[12..];
    if json_len > rest.len() {
        return Err(ProtoError::Malformed(
            "json length past the frame's end".into(),
        ));
    }
    let msg = serde_json::from_slice(&rest[..json_len])
        .map_err(|e| ProtoError::Malformed(e.to_string()))?;
    Ok((seq, msg, rest[json_len..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Msg;

    #[test]
    fn roundtrip_and_tamper() {
        let k = JobSecret::generate().unwrap();
        let n = [7u8; 16];
        let msg: Msg<()> = Msg::Ping { seq: 3 };
        let d = Direction::ToAcceptor;
        let f = encode_frame(&k, &n, d, 5, &msg, b"xyz").unwrap();
        let (seq, got, blob) = decode_frame(&k, &n, d, &f[4..]).unwrap();
        assert_eq!((seq, got, blob.as_slice()), (5, msg.clone(), &b"xyz"[..]));
        for i in 4..f.len() {
            let mut t = f.clone();
            t[i] ^= 1;
            assert!(
                matches!(
                    decode_frame::<Msg<()>>(&k, &n, d, &t[4..]),
                    Err(ProtoError::BadMac)
                ),
                "byte {i}"
            );
        }
        let other = JobSecret::generate().unwrap();
        assert!(matches!(
            decode_frame::<Msg<()>>(&other, &n, d, &f[4..]),
            Err(ProtoError::BadMac)
        ));
        assert!(matches!(
            decode_frame::<Msg<()>>(&k, &[8u8; 16], d, &f[4..]),
            Err(ProtoError::BadMac)
        ));
        // The same frame travelling the other way (reflected to its sender) does not verify.
        assert!(matches!(
            decode_frame::<Msg<()>>(&k, &n, d.reverse(), &f[4..]),
            Err(ProtoError::BadMac)
        ));
    }
}
