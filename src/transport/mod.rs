//! The transports: how prefill results arrive and how outputs leave. They
//! know NATS and nothing of the contract: no decision, identity, metrics or
//! configuration is imported here; the pipeline passes plain values in.
//!
//! - [`Source`]: where deliveries come from, each admitted within the
//!   in-flight [`Limits`] (a count and a byte budget), and stopped on drain.
//! - [`Delivery`]: one prefill result, which can be settled (ack, nak with a
//!   delay, term), report progress while its output is confirmed, and tell
//!   its delivery attempt.
//! - [`Sink`]: where outputs go: published, and in JetStream mode confirmed.
//!
//! Two implementations:
//!
//! - [`core`]: core NATS, a queue subscription on every prefill subject (at
//!   most once, contract 7), read in place by the runner through its
//!   intake, into the byte budget; its outputs are only enqueued on the
//!   connection, a batch's together from its [`Outbox`].
//! - [`jetstream`]: the durable mode, a work-queue stream and a shared pull
//!   consumer; outputs are confirmed by the server before the delivery is
//!   acked.
//!
//! Beside them: [`budget`], the byte budget both modes hold their results'
//! bytes in, and [`round_trip`], which returns once the server has
//! processed what a connection sent. The connection itself is made by
//! [`crate::connect`], from the configuration.

mod ack;
mod admission;
mod delivery;
mod publish_error;
mod round_trip;
mod sink;
mod source;

pub mod core;
pub mod jetstream;

pub mod budget;

pub use ack::Settle;
pub use admission::{Admission, Admitted, Limits};
pub use budget::Held;
pub use core::{CoreSink, Outbox};
pub use delivery::{Attempt, Delivery};
pub use publish_error::PublishError;
pub use round_trip::{Echo, RoundTripError, round_trip};
pub use sink::{Sink, Target};
pub use source::{Feed, Source};

pub(crate) use delivery::Settler;

/// Why the core transport could not be set up. Failures after start
/// (disconnects, publish errors) are logged and counted, not returned.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("subjects.prefill_results is empty; the worker needs at least one subject to consume")]
    NoSubjects,
    /// The client's error is the source (`{:#}` shows it after the message).
    #[error("cannot subscribe to {subject:?} (queue group {queue_group:?})")]
    Subscribe {
        subject: String,
        queue_group: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The server did not confirm the subscriptions ([`round_trip`]).
    #[error("the NATS server did not confirm the queue subscriptions")]
    Confirm(#[source] RoundTripError),
}
