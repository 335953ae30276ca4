//! Agent frames (`agents::proto::decode_frame`) before and after authentication.
//!
//! Before: the bytes are a frame body as it comes off the socket; nothing unauthenticated may
//! get past the MAC (a forged frame never decodes). After: the fuzzer's seq/json/blob are
//! signed with the job key exactly as a peer would (HMAC-SHA256 over the direction tag, the
//! receiver's nonce and the body), so the length checks, the JSON decoder and the message
//! types (agents' `Msg` and the staging protocol's `StageMsg`) are reached.
#![no_main]

use agents::proto::{Direction, Msg, decode_frame, encode_frame};
use agents::secret::JobSecret;
use hmac::{Hmac, Mac};
use launcher::stage::wire::StageMsg;
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;

const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const NONCE: [u8; 16] = *b"fuzz-nonce-0123!";

fn dir_tag(d: Direction) -> &'static [u8] {
    match d {
        Direction::ToAcceptor => b"vse-frame to-acceptor",
        Direction::ToDialer => b"vse-frame to-dialer",
    }
}

fn sign(key: &JobSecret, dir: Direction, signed: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("any key length");
    m.update(dir_tag(dir));
    m.update(&NONCE);
    m.update(signed);
    let mut body = signed.to_vec();
    body.extend_from_slice(&m.finalize().into_bytes());
    body
}

fn check<M>(key: &JobSecret, dir: Direction, body: &[u8])
where
    M: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok((seq, msg, blob)) = decode_frame::<M>(key, &NONCE, dir, body) {
        // What decodes re-encodes to a frame that decodes to the same thing.
        if let Ok(frame) = encode_frame(key, &NONCE, dir, seq, &msg, &blob) {
            let (s2, m2, b2) =
                decode_frame::<M>(key, &NONCE, dir, &frame[4..]).expect("own frame decodes");
            assert_eq!((s2, &m2, &b2), (seq, &msg, &blob));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let key = JobSecret::from_hex(KEY_HEX).expect("fixed key");
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let dir = if sel & 2 == 0 {
        Direction::ToAcceptor
    } else {
        Direction::ToDialer
    };
    if sel & 1 == 0 {
        // Unauthenticated bytes.
        let r = decode_frame::<Msg<()>>(&key, &NONCE, dir, rest);
        assert!(r.is_err(), "an unsigned frame decoded");
        let r = decode_frame::<StageMsg>(&key, &NONCE, dir, rest);
        assert!(r.is_err(), "an unsigned frame decoded");
    } else {
        // Authenticated: `rest` is `seq | json_len | json | blob` as a peer sends it. A fuzzer
        // cannot forge the MAC, so it is computed here; json_len is the fuzzer's, unchecked.
        let body = sign(&key, dir, rest);
        if sel & 4 == 0 {
            check::<Msg<()>>(&key, dir, &body);
        } else {
            check::<StageMsg>(&key, dir, &body);
        }
        // The other direction's key schedule never accepts it (reflection).
        assert!(decode_frame::<Msg<()>>(&key, &NONCE, dir.reverse(), &body).is_err());
    }
});
