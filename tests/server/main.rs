//! Integration tests that start one nats-server and/or one etcd (from the
//! harness in `tests/common/`): the worker in core and durable mode, the ID
//! service and the identity, secure transport, supervision, metrics, the
//! load generator, and the harness itself.
//!
//! One test binary instead of one per file (see `tests/offline/main.rs`).
//! Each former `tests/NAME.rs` is the module `NAME` here; nextest shows its
//! tests as `server NAME::test`.

#[path = "../common/mod.rs"]
mod common;

mod cancel_flood;
mod cancel_reconnect;
mod core_sink;
mod deadlines;
mod engine_handoff;
mod fault_proxy;
mod harness;
mod hostile_publisher;
mod id_service;
mod identity;
mod jetstream_cli;
mod jetstream_confirm;
mod jetstream_failures;
mod jetstream_flow;
mod jetstream_gen_full;
mod jetstream_identity;
mod jetstream_late_redelivery;
mod jetstream_objects;
mod jetstream_setup;
mod jetstream_slow;
mod loadgen;
mod metrics;
mod nats_parser;
mod partition;
mod secure_late_redelivery;
mod secure_transport;
mod supervision;
mod tap;
mod telemetry;
mod worker_bounds;
mod worker_core;
mod worker_edges;
