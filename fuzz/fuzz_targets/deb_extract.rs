//! `.deb` reading and extraction as the image builder does it: `imgbuild::deb::read_deb` (the
//! ar container, `debian-binary`, the control tarball, the member decompressors behind their
//! size limit, the verified-bytes check) handing the data tarball to
//! `imgbuild::deb::extract_data` (path confinement, symlinks, hard links, metadata records)
//! into a scratch root; afterwards nothing may exist outside that root.
//!
//! Input: either a raw `.deb` or a structured one (the fuzzer's tar entries, compressed and
//! wrapped by the harness, so the deep extraction code is reached).
#![no_main]

use arbitrary::Arbitrary;
use imgbuild::deb::{DebError, DebFile, ExtractError, Records, extract_data, read_deb};
use libfuzzer_sys::fuzz_target;
use vse_fuzz::{Scratch, TarEntry, build_ar, build_tar, compress, deb_suffix};

/// First byte 0: the rest is a raw `.deb`; else the rest is a [`Built`] package.
#[derive(Debug)]
enum Input {
    Raw(Vec<u8>),
    Built(Built),
}

#[derive(Debug, Arbitrary)]
struct Built {
    data: Vec<TarEntry>,
    data_comp: u8,
    control_comp: u8,
    /// Replaces the harness's control tarball when set.
    control_raw: Option<Vec<u8>>,
    version: Option<Vec<u8>>,
    /// Bytes appended to the compressed data member (trailing garbage).
    tail: Vec<u8>,
}

#[derive(Debug)]
#[allow(dead_code)] // read by Debug only
enum Error {
    Deb(DebError),
    Extract(ExtractError),
}
impl From<DebError> for Error {
    fn from(e: DebError) -> Self {
        Error::Deb(e)
    }
}

/// Uncompressed data limit for the run: small, so that a bomb stops early.
const LIMIT: u64 = 8 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let input = if mode == 0 {
        Input::Raw(rest.to_vec())
    } else {
        match Built::arbitrary_take_rest(arbitrary::Unstructured::new(rest)) {
            Ok(b) => Input::Built(b),
            Err(_) => return,
        }
    };
    let bytes = match &input {
        Input::Raw(b) => b.clone(),
        Input::Built(Built {
            data,
            data_comp,
            control_comp,
            control_raw,
            version,
            tail,
        }) => {
            let control = control_raw.clone().unwrap_or_else(|| {
                build_tar(&[TarEntry {
                    name: vse_fuzz::TarName::Raw(b"./control".to_vec()),
                    kind: 0,
                    mode: 0o644,
                    link: vse_fuzz::TarName::Raw(vec![]),
                    data: b"Package: fuzz\nVersion: 1\nArchitecture: amd64\n".to_vec(),
                    uid: 0,
                }])
            });
            let mut data_member = compress(*data_comp, &build_tar(data));
            data_member.extend_from_slice(tail);
            build_ar(&[
                (
                    "debian-binary".into(),
                    version.clone().unwrap_or_else(|| b"2.0\n".to_vec()),
                ),
                (
                    format!("control.tar{}", deb_suffix(*control_comp)),
                    compress(*control_comp, &control),
                ),
                (format!("data.tar{}", deb_suffix(*data_comp)), data_member),
            ])
        }
    };
    let s = Scratch::new();
    let deb_path = s.dir.path().join("a/b/c/pkg.deb");
    std::fs::write(&deb_path, &bytes).expect("write deb");
    let deb = DebFile::hashed(deb_path.clone()).expect("hash deb");
    let mut records = Records::new();
    let r = read_deb(&deb, LIMIT, |tar| -> Result<(), Error> {
        extract_data(tar, &s.root, &mut records)
            .map(|_| ())
            .map_err(Error::Extract)
    });
    if let Ok(control) = r {
        let _ = control.field("Package");
    }
    s.check_confined(&[deb_path]);
});
