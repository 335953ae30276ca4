//! Debian repository metadata as vsec reads it: `Packages` (deb822 stanzas, typed fields),
//! `Release` (dates, SHA256 lists) and `InRelease` (cleartext-signature split and armor, then
//! the Release inside), each optionally behind the index decompressors (gz, xz, lz4).
//! The first byte picks the file kind and the compression.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::index::PackagesIndex;
use vsec::repo::compress::{Compression, decompress};
use vsec::repo::release::Release;
use vsec::repo::verify::{Keyring, verify_inrelease};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let compression = match (sel >> 4) & 3 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Xz,
        _ => Compression::Lz4,
    };
    let Ok(bytes) = decompress(rest, compression) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return;
    };
    match sel % 3 {
        0 => {
            if let Ok(idx) = PackagesIndex::parse(Path::new("Packages"), text, 0) {
                let _ = idx.by_name();
            }
        }
        1 => {
            let _ = Release::parse(Path::new("Release"), text);
        }
        _ => {
            // No key verifies: what is reached is the split, the armor and the signature
            // packets; the signed text is parsed as a Release directly as well.
            let _ = verify_inrelease("InRelease", text, &Keyring::default());
            let _ = Release::parse(Path::new("InRelease"), text);
        }
    }
});
