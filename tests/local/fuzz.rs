//! The fuzz targets under `cargo test`: every file of the committed corpus (`fuzz/corpus/`)
//! replayed through the same bodies libFuzzer runs (`fuzz/targets.rs`), then proptest inputs
//! (random bytes, and corpus files with random bytes changed), so the targets hold on any
//! toolchain. The coverage-guided runs themselves: `scripts/fuzz` (cargo-fuzz).

#[path = "../../fuzz/targets.rs"]
mod targets;

use std::path::Path;

use proptest::prelude::*;

/// A target's name (its corpus folder) and body.
type Target = (&'static str, fn(&[u8]));

const TARGETS: [Target; 4] = [
    ("request", targets::request),
    ("json", targets::json),
    ("rules_file", targets::rules_file),
    ("rules_dir", targets::rules_dir),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_corpus_file_is_handled_without_a_panic() {
    for (target, body) in TARGETS {
        let corpus = targets::corpus(root(), target);
        assert!(
            corpus.len() >= 5,
            "fuzz/corpus/{target} has {} files: the seeds are missing",
            corpus.len()
        );
        for (name, bytes) in corpus {
            let outcome = std::panic::catch_unwind(|| body(&bytes));
            assert!(outcome.is_ok(), "fuzz/corpus/{target}/{name} panicked");
        }
    }
}

/// A corpus file of `target` with up to 8 bytes replaced, inserted or removed.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let corpus = targets::corpus(root(), target);
    (
        0..corpus.len(),
        proptest::collection::vec((any::<u16>(), any::<u8>(), 0u8..3), 0..8),
    )
        .prop_map(move |(pick, edits)| {
            let mut bytes = corpus[pick].1.clone();
            for (at, byte, how) in edits {
                let at = usize::from(at) % (bytes.len() + 1);
                match how {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => bytes.push(byte),
                }
            }
            bytes
        })
}

proptest! {
    // A fixed seed, so CI never turns red by the draw; the coverage-guided runs explore.
    #![proptest_config(ProptestConfig {
        cases: 300,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xF022),
        ..ProptestConfig::default()
    })]

    #[test]
    fn requests_from_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        targets::request(&bytes);
    }

    #[test]
    fn requests_near_the_corpus(bytes in mutated("request")) {
        targets::request(&bytes);
    }

    #[test]
    fn json_near_the_corpus(bytes in mutated("json")) {
        targets::json(&bytes);
    }

    #[test]
    fn rules_files_near_the_corpus(bytes in mutated("rules_file")) {
        targets::rules_file(&bytes);
    }

    #[test]
    fn rules_directories_near_the_corpus(bytes in mutated("rules_dir")) {
        targets::rules_dir(&bytes);
    }
}
