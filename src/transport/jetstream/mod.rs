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
//! [`crate::transport::Delivery`]'s; which settlement follows what happened
//! is the pipeline's rule.

pub mod ack_subject;
pub mod confirm;
pub mod consume;
pub mod open;
pub mod publish;
pub mod pulls;
pub mod sweep;

pub use consume::{Puller, start};
pub use open::open;

use super::Settle;
use async_nats::jetstream::{AckKind, message::Acker};
use std::future::Future;
use std::time::Duration;
use tracing::debug;

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

/// Sends a settlement. If it is lost, the ack wait expires and the message
/// comes again anyway.
pub(super) async fn settle(acker: &Acker, settle: Settle) {
    // A plain ack, not a confirmed one: confirming would cost a round trip
    // per message and change nothing, since a lost ack means the same either
    // way (the message comes again and its output repeats; the GEN stream
    // drops a repeated decode job). Shutdown flushes the connection, so acks
    // taken before it reach the server.
    let kind = match settle {
        Settle::Ack => AckKind::Ack,
        Settle::Term => AckKind::Term,
        Settle::Nak(delay) => AckKind::Nak(Some(delay)),
    };
    // Boxed: inline, the ack's publish made every result's future 768
    // bytes larger (`-Zprint-type-sizes`), moved several times per result.
    if let Err(e) = Box::pin(acker.ack_with(kind)).await {
        debug!(error = %e, ?settle, "settlement not sent; the message is redelivered after the ack wait");
    }
}

/// Runs `work`, sending an in-progress ack every `every` while it is pending.
pub(super) async fn with_progress<F: Future>(work: F, acker: &Acker, every: Duration) -> F::Output {
    let every = every.max(Duration::from_millis(100));
    tokio::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = ticks.tick() => {
                // Boxed: rare, and inline it would grow every result's future.
                if let Err(e) = Box::pin(acker.ack_with(AckKind::Progress)).await {
                    debug!(error = %e, "in-progress ack not sent");
                }
            }
        }
    }
}
