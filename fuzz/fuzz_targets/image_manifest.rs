//! Any bytes as an image's `manifest.json` (`vse_image::parse_manifest`, what
//! `ImageDir::open` runs), then the part lookups a launcher makes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/nonexistent/image");
    if let Ok(m) = vse_image::parse_manifest(dir, &dir.join("manifest.json"), data) {
        for part in ["kernel", "initrd", "root", "qcow2", "../x", ""] {
            let _ = m.part_path(dir, part);
        }
        let _ = m.parts_present(dir);
        let _ = serde_json::to_string(&m);
    }
});
