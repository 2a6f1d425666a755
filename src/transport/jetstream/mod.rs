//! JetStream delivery (contract 7): a work-queue stream over the prefill
//! subjects, one durable pull consumer shared by all workers, and an ack only
//! after the message's output is known to have reached the server (stored,
//! when GEN is a stream). A worker killed mid-flight loses nothing: the
//! server redelivers what it never acked, and `Nats-Msg-Id` makes the GEN
//! stream drop a repeated job.
//!
//! - [`open`]: opening the durable consumer.
//! - [`consume`]: the pull loop, bounded by free processing slots and bytes;
//!   survives server restarts.
//! - [`pulls`]: the pulls under way on the one inbox, and the slots and
//!   bytes held for them.
//! - [`publish`]: outputs known to have reached the server (stream ack, or
//!   a confirmed core publish), and the late-redelivery lookup in GEN.
//! - [`confirm`]: one server round trip confirms every core publish enqueued
//!   before it, shared by all deliveries.
//! - [`sweep`]: removes acked messages a restarted old server kept.
//! - [`ack_subject`]: the delivery count and store time, read from the ack
//!   subject.
//!
//! Settling a delivery (ack, nak with a delay, term, in-progress) is
//! [`crate::transport::Delivery`]'s, sent as `transport/ack.rs` sends it;
//! which settlement follows what happened is the pipeline's rule.

pub mod ack_subject;
pub mod confirm;
pub mod consume;
pub mod open;
pub mod publish;
pub mod pulls;
pub mod sweep;

pub use consume::{Puller, start};
pub use open::open;

/// Why the durable consumer could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A JetStream API request failed (server unreachable, permission, ...):
    /// worth retrying.
    #[error("JetStream: {0}")]
    Api(String),
    /// The stream or consumer does not exist.
    #[error("{0}")]
    Missing(String),
}
