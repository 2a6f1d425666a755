//! Every curated seed of the fuzz corpus (fuzz/corpus/<target>/), including
//! the inputs that once crashed a fuzz target, passes that target's checks:
//! the fuzz targets' properties, replayed by the normal test suite without
//! libFuzzer. The checks are the fuzz crate's own (fuzz/src/targets.rs).

// targets.rs uses `crate::decision_support`, declared in main.rs.
#[path = "../../fuzz/src/targets.rs"]
mod targets;

use std::path::Path;

/// Runs `check` on every file of the target's seed directory; the seed
/// directory must not be empty.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{} holds no seeds", dir.display());
    for seed in seeds {
        let bytes = std::fs::read(&seed).expect("a seed file reads");
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(
            outcome.is_ok(),
            "seed {} fails its target's checks",
            seed.display()
        );
    }
}

#[test]
fn wire_msgpack_seeds() {
    replay("wire_msgpack", targets::wire_msgpack);
}

#[test]
fn decide_msgpack_seeds() {
    replay("decide_msgpack", targets::decide_msgpack);
}

#[test]
fn decide_json_seeds() {
    replay("decide_json", targets::decide_json);
}

#[test]
fn nats_headers_seeds() {
    replay("nats_headers", targets::nats_headers);
}
