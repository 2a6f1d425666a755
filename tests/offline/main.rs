//! Integration tests that need no server: the decision, wire encodings,
//! configuration, request IDs, the offline commands, the deployment examples,
//! the documents against the code, the fuzz seed corpus and the patched NATS
//! parser.
//!
//! One test binary instead of one per file: every test binary links the whole
//! dependency tree, so fewer binaries means a smaller and faster cold build.
//! Each former `tests/NAME.rs` is the module `NAME` here; nextest shows its
//! tests as `offline NAME::test`.

mod decision_support;
#[path = "../common/tls.rs"]
#[allow(
    dead_code,
    reason = "the configuration tests need the PKI files, not the server settings built from them (the server binary uses those)"
)]
mod tls;

mod cli_offline;
mod config;
mod decision;
mod decision_bounds;
mod decision_dead_letter;
mod decision_deadline;
mod decision_fast;
mod decision_fast_json;
mod decision_handoff;
mod decision_hostile;
mod decision_job;
mod decision_malformed;
mod decision_shapes;
mod deploy_config;
mod docs;
mod fuzz_corpus;
mod ids;
mod wire;
