//! Guest-agent protocol lines (one JSON object per line) both ways: `Request` as the guest
//! parses it and `Message` as the host parses it. What parses must survive its own encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vse_guest_agent::protocol::{Message, Request};

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let line = line.trim();
        if let Ok(r) = serde_json::from_str::<Request>(line) {
            let text = serde_json::to_string(&r).expect("a Request encodes");
            let back: Request = serde_json::from_str(&text).expect("an encoded Request parses");
            assert_eq!(back, r);
        }
        if let Ok(m) = serde_json::from_str::<Message>(line) {
            let _ = m.id();
            let text = serde_json::to_string(&m).expect("a Message encodes");
            let back: Message = serde_json::from_str(&text).expect("an encoded Message parses");
            assert_eq!(back, m);
        }
    }
});
