//! What the fuzz targets check, as plain functions of the input bytes
//! (`targets`), so the normal test suite can replay the seed corpus through
//! the same checks without libFuzzer (tests/offline/fuzz_corpus.rs).
//!
//! The decision's ID source and its invariants are the decision tests' own
//! (tests/offline/decision_support), not a second copy.

#[path = "../../tests/offline/decision_support/mod.rs"]
pub mod decision_support;
pub mod targets;
