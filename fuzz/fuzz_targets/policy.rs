//! Any bytes through the policy loader (`vsec::policy::parse_source`), then stacked on itself
//! (the narrowing checks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::yaml::Source;

fuzz_target!(|data: &[u8]| {
    let src = Source::from_bytes(
        "fuzz.policy.yaml",
        Path::new("/nonexistent/fuzz.policy.yaml"),
        data.to_vec(),
    );
    if let Ok(p) = vsec::policy::parse_source(&src) {
        let site = p.clone().site();
        let _ = vsec::merge::stack(&[site, p]);
    }
});
