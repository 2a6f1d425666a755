//! # prefill-handoff
//!
//! A NATS worker between the prefill and decode fleets of a disaggregated LLM
//! serving platform. For every prefill result it publishes exactly one
//! message: a decode job, a terminal response, an error response, or a dead
//! letter. The contract is `docs/protocol.md`.
//!
//! # Layout
//!
//! In the data's path, subscribe → decode → decide → publish → settle:
//!
//! - [`transport`]: how results arrive and outputs leave: a source of
//!   deliveries (core NATS queue group, JetStream pull consumer) and a sink
//!   (enqueued, or confirmed by the server). Knows NATS, not the contract.
//! - [`pipeline`]: one delivery from either transport through decode →
//!   decide → publish → settle, and the runner that bounds in-flight work
//!   and drains on shutdown.
//! - [`wire`]: MessagePack and JSON codecs over value trees that keep unknown
//!   fields, and the output messages.
//! - [`headers`]: NATS headers in and out: read without regard to case,
//!   the W3C trace headers passed on, an output's headers built from the
//!   decision's names and values.
//! - [`decision`]: the pure core: one prefill result in, one outcome out;
//!   error and dead-letter codes; the reply-subject allowlist; deadlines.
//! - [`cancel`]: cancels of requests, held in a bounded set the decision
//!   asks; the cancel message.
//! - [`ids`]: the rc21/rc22 request-ID layouts and the never-repeating generator.
//! - [`identity`]: the etcd lease, the exclusive machine-ID slot, fencing and
//!   recovery (the [`decision`]'s ID source).
//!
//! Around it:
//!
//! - [`connect`]: the one NATS connection, from `nats.*`.
//! - [`setup`]: the JetStream streams and consumer, created or checked.
//! - [`redelivery`]: JetStream's redelivery schedule (nak delays, delivery
//!   limit, the span they allow), for the settling rules and the setup.
//! - [`id_service`]: the ID mint service: request IDs over NATS request/reply.
//! - [`config`]: TOML file, `HANDOFF_*` environment and flags.
//! - [`security`]: TLS files and NKey seeds for NATS and etcd, checked at start.
//! - [`metrics`]: Prometheus metrics, `/healthz` and `/readyz`.
//! - [`telemetry`]: OpenTelemetry spans per result, exported over OTLP.
//! - [`cli`]: the `prefill-handoff` subcommands.
//!
//! The load generator and the raw relays it is compared with are a crate of
//! their own, `crates/loadgen`; the binary adds its `loadgen` command.

// A function over 80 lines (clippy.toml) says why it is not split, in
// `#[expect(clippy::too_many_lines, reason = "...")]`: scripts/check-modules.sh.
#![warn(clippy::too_many_lines)]

pub mod alloc;
pub mod cancel;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connect;
pub mod decision;
pub mod headers;
pub mod id_service;
pub mod identity;
pub mod ids;
pub mod metrics;
pub mod pipeline;
pub mod redelivery;
pub mod security;
pub mod setup;
pub mod telemetry;
pub mod transport;
pub mod wire;
