//! Integration tests with several servers or several worker processes: a
//! 3-member etcd, a 3-node NATS cluster, and `prefill-handoff run` as child
//! processes killed and restarted under load.
//!
//! One test binary instead of one per file (see `tests/offline/main.rs`).
//! Each former `tests/NAME.rs` is the module `NAME` here; nextest shows its
//! tests as `cluster NAME::test`. The cluster tests run one at a time
//! (`.config/nextest.toml`).

#[path = "../common/mod.rs"]
#[allow(
    dead_code,
    reason = "the cluster tests use a part of the harness; the server binary, which uses all of it, is where an unused helper shows"
)]
mod common;

mod cluster_etcd;
mod jetstream_cluster;
mod jetstream_process;
mod worker_process;
