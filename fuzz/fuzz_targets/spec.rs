//! Any bytes through the spec loader (`vsec::spec::parse_source`, what `load` runs on a file's
//! bytes), then the merge and the environment hash: errors are fine; panics, hangs and
//! unbounded memory are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::yaml::Source;

fuzz_target!(|data: &[u8]| {
    let src = Source::from_bytes(
        "fuzz.vse.yaml",
        Path::new("/nonexistent/fuzz.vse.yaml"),
        data.to_vec(),
    );
    if let Ok(spec) = vsec::spec::parse_source(&src)
        && let Ok(env) = vsec::merge::merge(&spec, &[])
    {
        let _ = env.env_hash();
    }
});
