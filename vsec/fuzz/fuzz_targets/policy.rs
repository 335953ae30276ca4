//! Any bytes through the policy parser, then stacked twice (exercises the narrowing checks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::yaml::Source;

fuzz_target!(|data: &[u8]| {
    let src = Source::from_bytes("fuzz.policy.yaml", Path::new("/nonexistent/fuzz.policy.yaml"), data.to_vec());
    if let Ok(p) = vsec::policy::parse_source(&src) {
        let _ = vsec::merge::stack(&[p.clone(), p]);
    }
});
