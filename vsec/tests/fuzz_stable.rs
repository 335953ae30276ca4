//! The fuzz targets' bodies on the stable toolchain: random bytes and random edits of the
//! example specs and policies go through the parsers and the merge. Any panic fails.
//! (`fuzz/`: the `spec` and `policy` targets run these parsers under libFuzzer on nightly.)

use proptest::prelude::*;
use std::path::Path;
use vsec::yaml::Source;

fn run_spec(data: &[u8]) {
    let src = Source::from_bytes(
        "f.vse.yaml",
        Path::new("/nonexistent/f.vse.yaml"),
        data.to_vec(),
    );
    if let Ok(spec) = vsec::spec::parse_source(&src)
        && let Ok(env) = vsec::merge::merge(&spec, &[])
    {
        let _ = env.env_hash();
    }
}

fn run_policy(data: &[u8]) {
    let src = Source::from_bytes(
        "f.policy.yaml",
        Path::new("/nonexistent/f.policy.yaml"),
        data.to_vec(),
    );
    if let Ok(p) = vsec::policy::parse_source(&src) {
        let _ = vsec::merge::stack(&[p.clone(), p]);
    }
}

fn corpus() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("invalid")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().ends_with(".yaml") {
                out.push(std::fs::read(p).unwrap());
            }
        }
    }
    out
}

/// One edit: overwrite, insert or delete a byte span with YAML-significant characters.
fn mutate(mut doc: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    const BYTES: &[u8] = b" \n:-[]{}&*!|>'\"#,?%@`0123456789abcxyzGiMB.\t\xff";
    for &(pos, kind, b) in edits {
        let pos = if doc.is_empty() {
            0
        } else {
            pos % (doc.len() + 1)
        };
        let b = BYTES[b as usize % BYTES.len()];
        match kind % 3 {
            0 if pos < doc.len() => doc[pos] = b,
            1 => doc.insert(pos, b),
            _ if pos < doc.len() => {
                doc.remove(pos);
            }
            _ => doc.push(b),
        }
    }
    doc
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        run_spec(&data);
        run_policy(&data);
    }

    #[test]
    fn edited_examples_never_panic(
        which in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8),
    ) {
        let docs = corpus();
        let doc = mutate(docs[which % docs.len()].clone(), &edits);
        run_spec(&doc);
        run_policy(&doc);
    }
}
