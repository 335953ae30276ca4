//! Any bytes through the spec parser and the merge: errors are fine, panics, hangs and
//! unbounded memory are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::yaml::Source;

fuzz_target!(|data: &[u8]| {
    let src = Source::from_bytes("fuzz.vse.yaml", Path::new("/nonexistent/fuzz.vse.yaml"), data.to_vec());
    if let Ok(spec) = vsec::spec::parse_source(&src) {
        if let Ok(env) = vsec::merge::merge(&spec, &[]) {
            let _ = env.env_hash();
        }
    }
});
