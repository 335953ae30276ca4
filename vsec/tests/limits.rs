//! Hostile input: size, depth, aliases, bytes. Each must give a located error quickly and
//! never panic.

use std::path::Path;
use vsec::yaml::Source;

fn parse(bytes: Vec<u8>) -> String {
    let src = Source::from_bytes("t.vse.yaml", Path::new("/nonexistent/t.vse.yaml"), bytes);
    match vsec::spec::parse_source(&src) {
        Ok(_) => panic!("hostile input was accepted"),
        Err(d) => d.to_string(),
    }
}

#[test]
fn huge_file_is_refused_before_parsing() {
    let mut text =
        b"version: 1\nname: huge\nbase: {distribution: debian, suite: bookworm}\npackages:\n"
            .to_vec();
    while text.len() <= vsec::yaml::MAX_INPUT_BYTES {
        text.extend_from_slice(b"  - busybox\n");
    }
    let e = parse(text);
    assert!(
        e.starts_with("t.vse.yaml:1:1: file is larger than 1024 KiB"),
        "{e}"
    );
}

#[test]
fn deep_nesting_is_refused() {
    let text = format!(
        "version: 1\npackages: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let e = parse(text.into_bytes());
    assert!(e.starts_with("t.vse.yaml:2:"), "{e}");
}

#[test]
fn alias_bomb_is_refused() {
    let mut text = String::from("version: 1\nname: b\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        text.push_str(&format!(
            "a{i}: &a{i} [{}]\n",
            vec![format!("*a{}", i - 1); 10].join(", ")
        ));
    }
    // Through the spec schema the bomb fails at once on a type mismatch...
    let e = parse(text.clone().into_bytes());
    assert!(e.starts_with("t.vse.yaml:"), "{e}");
    // ...and a schema-less walk that would expand every alias hits the budget instead.
    let src = Source::from_bytes("t.yaml", Path::new("/t.yaml"), text.into_bytes());
    let e = vsec::yaml::parse::<serde::de::IgnoredAny>(&src, "spec").unwrap_err();
    assert!(e.to_string().starts_with("t.yaml:"), "{e}");
    assert!(e.hint.is_some(), "{e}");
}

#[test]
fn non_utf8_is_located() {
    let e = parse(b"version: 1\nname: caf\xe9\n".to_vec());
    assert_eq!(
        e,
        "t.vse.yaml:2:10: invalid UTF-8 byte\n  hint: save the file as UTF-8"
    );
}
