//! One delivery: what arrived, which attempt it is, and how it is settled.

use super::ack::{self, Settle};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures::future::Either;
use std::future::Future;
use std::time::{Duration, Instant};

/// One received prefill result, whatever transport it came from.
#[derive(Debug)]
pub struct Delivery {
    /// The subject it arrived on.
    pub subject: Subject,
    pub payload: Bytes,
    pub headers: Option<HeaderMap>,
    /// The NATS message's own reply subject, where a request's answer may
    /// go. Always `None` from a durable source: there the NATS reply subject
    /// is the ack subject, which never leaves the transport (this is the one
    /// place that keeps durable mode from answering on it).
    pub reply: Option<Subject>,
    /// When the worker took it from the transport; latency is measured from here.
    pub received_at: Instant,
    pub attempt: Attempt,
    pub(crate) settler: Settler,
}

/// Which delivery of its message this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first delivery.
    pub number: i64,
    /// When the server stored the message (durable mode only).
    pub stored_at: Option<time::OffsetDateTime>,
}

impl Attempt {
    /// The only delivery an at-most-once transport makes.
    pub const ONLY: Attempt = Attempt {
        number: 1,
        stored_at: None,
    };
}

/// How a delivery is settled with its transport.
pub(crate) enum Settler {
    /// Core NATS: at most once, nothing to settle.
    AtMostOnce,
    /// JetStream: the message's ack subject; progress every `every`.
    JetStream {
        acker: Box<async_nats::jetstream::message::Acker>,
        every: Duration,
    },
}

impl std::fmt::Debug for Settler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Settler::AtMostOnce => f.write_str("AtMostOnce"),
            Settler::JetStream { every, .. } => {
                f.debug_struct("JetStream").field("every", every).finish()
            }
        }
    }
}

impl Delivery {
    /// Whether this transport can deliver the message again (a nak means
    /// something).
    pub fn redeliverable(&self) -> bool {
        matches!(self.settler, Settler::JetStream { .. })
    }

    /// Settles the delivery. A settlement that cannot be sent is logged: the
    /// server's ack wait redelivers the message anyway.
    pub async fn settle(&self, settle: Settle) {
        if let Settler::JetStream { acker, .. } = &self.settler {
            ack::settle(acker, settle).await;
        }
    }

    /// Runs `work` (publishing this delivery's output), reporting progress
    /// to the server while it is pending so the delivery does not time out.
    pub fn while_pending<'a, F: Future + 'a>(
        &'a self,
        work: F,
    ) -> impl Future<Output = F::Output> + 'a {
        // No async wrapper around `work` in core mode, and the JetStream one
        // boxed: this future is held and moved once per result, and an async
        // fn holding `work` in each arm (argument, pinned copy, progress
        // loop) would be several times its size.
        match &self.settler {
            Settler::AtMostOnce => Either::Left(work),
            Settler::JetStream { acker, every } => {
                Either::Right(Box::pin(ack::with_progress(work, acker, *every)))
            }
        }
    }
}
