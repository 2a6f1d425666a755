//! # prefill-handoff
//!
//! A NATS worker between the prefill and decode fleets of a disaggregated LLM
//! serving platform. For every prefill result it publishes exactly one
//! message: a decode job, a terminal response, an error response, or a dead
//! letter. The contract is `docs/protocol.md`.
//!
//! # Layout
//!
//! The data's path is subscribe → decode → decide → publish → ack:
//!
//! - [`wire`]: MessagePack and JSON codecs over value trees that keep unknown
//!   fields, and the output messages.
//! - [`decision`]: the pure core: one prefill result in, one outcome out;
//!   error and dead-letter codes; the reply-subject allowlist.
//! - [`ids`]: the rc21/rc22 request-ID layouts and the never-repeating generator.
//! - [`identity`]: the etcd lease, the exclusive machine-ID slot, fencing and
//!   recovery.
//! - [`transport`]: core NATS (queue group) and JetStream (durable pull consumer).
//! - [`worker`]: the loop that ties a transport, the decision and the identity.
//! - [`id_service`]: the ID mint service: request IDs over NATS request/reply.
//! - [`config`]: TOML file, `HANDOFF_*` environment and flags.
//! - [`security`]: TLS files and NKey seeds for NATS and etcd, checked at start.
//! - [`metrics`]: Prometheus metrics, `/healthz` and `/readyz`.
//! - [`telemetry`]: OpenTelemetry spans per result, exported over OTLP.
//! - [`cli`]: the `prefill-handoff` subcommands.
//! - [`loadgen`]: the load generator and the raw relays it is compared with.

pub mod cli;
pub mod clock;
pub mod config;
pub mod decision;
pub mod id_service;
pub mod identity;
pub mod ids;
pub mod loadgen;
pub mod metrics;
pub mod pipeline;
pub mod security;
pub mod setup;
pub mod telemetry;
pub mod transport;
pub mod wire;
