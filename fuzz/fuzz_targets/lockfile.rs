//! Any text through the lockfile parser (`Lockfile::from_toml`, what `Lockfile::read` runs);
//! a lockfile it accepts must survive its own writer and parse again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vsec::lock::Lockfile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/nonexistent/vse.lock");
    if let Ok(lock) = Lockfile::from_toml(path, text) {
        let _ = lock.kernel();
        let again = lock.to_toml();
        if let Err(e) = Lockfile::from_toml(path, &again) {
            panic!("a lockfile that parsed does not parse after to_toml: {e}\n{again}");
        }
    }
});
