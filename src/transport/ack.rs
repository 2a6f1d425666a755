//! Settling a JetStream delivery with the server: what [`Settle`] says, and
//! in-progress acks while its output is pending. A leaf of its own, so that
//! the delivery, which the JetStream transport builds, need not import it.

use async_nats::jetstream::{AckKind, message::Acker};
use std::future::Future;
use std::time::Duration;
use tracing::debug;

/// What is done with a delivery once its fate is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done: never deliver it again.
    Ack,
    /// Done, and never to be redelivered: marked terminated, not done.
    Term,
    /// Not done: deliver it again after the delay.
    Nak(Duration),
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
    // Boxed: inline, the ack's publish would make every result's future,
    // moved several times per result, much larger (`docs/performance.md`).
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
