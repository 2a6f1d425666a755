//! Where outputs go: one [`Sink`], enqueued (core NATS) or confirmed
//! (JetStream).

use super::core::{CoreSink, Outbox};
use super::jetstream;
use async_nats::HeaderMap;
use async_nats::client::PublishErrorKind;
use bytes::Bytes;
use futures::future::{BoxFuture, Either, Ready, ready};
use std::time::Duration;

/// Why an output is not known to have reached the server.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Bigger than the server's `max_payload`: this output can never be sent.
    #[error("the output is larger than the NATS server accepts: {0}")]
    TooLarge(String),
    /// A subject the client refuses: this output can never be sent there.
    #[error("{subject:?} is not a subject NATS accepts: {reason}")]
    InvalidSubject { subject: String, reason: String },
    /// Worth retrying later: the server, the connection or the stream failed.
    #[error("publishing to {subject}: {reason}")]
    Failed { subject: String, reason: String },
    /// The stream answered that it cannot store the message (JetStream
    /// error 10077: at its `max_msgs` or `max_bytes` with discard policy
    /// `new`, or its store failing). Every message into it is refused
    /// alike until it has room: worth retrying then, not sooner.
    #[error("the stream on {subject} did not store the message: {reason}")]
    Refused { subject: String, reason: String },
}

/// Whether an output goes into a stream (waiting for its stored ack) or
/// onto a plain subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Subject,
    Stream,
}

/// A publish under way ([`Sink::publish`]): done at once (put in an
/// outbox, or refused), or waiting on the server.
pub type Publishing<'a> =
    Either<Ready<Result<(), PublishError>>, BoxFuture<'a, Result<(), PublishError>>>;

/// Where outputs go: one variant per delivery mode.
#[derive(Clone)]
pub enum Sink {
    /// Enqueued on the connection; pipelined, flushed at shutdown.
    Core(CoreSink),
    /// Known to have reached the server before the call returns.
    JetStream(Box<jetstream::publish::Publisher>),
}

impl Sink {
    /// Whether a publish waits for the server (JetStream mode): outputs of
    /// one batch are then published concurrently.
    pub fn confirms(&self) -> bool {
        matches!(self, Sink::JetStream(_))
    }

    /// Publishes one output. An empty header map publishes without headers.
    ///
    /// In core mode, given a batch's `outbox`, the output is checked and put
    /// in it (when called, not when awaited), and leaves when the runner
    /// sends the outbox ([`Sink::send`]); without one it leaves at once.
    /// JetStream mode publishes at once and waits for the server; it is
    /// never given an outbox.
    ///
    /// Not an `async fn`: as one, the futures it awaits made every result's
    /// future much larger, in both modes, and that future is moved several
    /// times per result. What waits on the server is boxed instead:
    /// allocated once per result in JetStream mode, and in core mode only
    /// for an output sent outside a batch.
    pub fn publish<'a>(
        &'a self,
        subject: &'a str,
        headers: HeaderMap,
        payload: Bytes,
        target: Target,
        outbox: Option<&mut Outbox>,
    ) -> Publishing<'a> {
        match (self, outbox) {
            (Sink::Core(sink), Some(outbox)) => {
                Either::Left(ready(sink.put(outbox, subject, headers, payload)))
            }
            (Sink::Core(sink), None) => {
                Either::Right(Box::pin(sink.send_one(subject, headers, payload)))
            }
            (Sink::JetStream(sink), _) => Either::Right(match target {
                Target::Stream => Box::pin(sink.stored(subject, headers, payload)),
                Target::Subject => Box::pin(sink.confirmed(subject, headers, payload)),
            }),
        }
    }

    /// Sends a batch's outbox (core mode). Returns how many of its outputs
    /// went out, in order: the first that many; the rest are lost.
    pub async fn send(&self, outbox: Outbox) -> usize {
        match self {
            Sink::Core(sink) => sink.send(outbox).await,
            // Never given an outbox: nothing in it to send.
            Sink::JetStream(_) => {
                debug_assert!(
                    outbox.is_empty(),
                    "JetStream outputs are never put in an outbox"
                );
                0
            }
        }
    }

    /// Waits until the server has received everything published so far, or
    /// `timeout` passes. True when flushed.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let client = match self {
            Sink::Core(sink) => sink.client(),
            Sink::JetStream(sink) => &sink.client,
        };
        match tokio::time::timeout(timeout, client.flush()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "flushing NATS failed");
                false
            }
            Err(_) => {
                tracing::warn!(?timeout, "flushing NATS timed out");
                false
            }
        }
    }
}

/// What a client publish error means for the output.
pub(super) fn publish_error(subject: &str, e: &async_nats::PublishError) -> PublishError {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::TooLarge(e.to_string()),
        PublishErrorKind::InvalidSubject => PublishError::InvalidSubject {
            subject: subject.to_string(),
            reason: e.to_string(),
        },
        PublishErrorKind::Send => PublishError::Failed {
            subject: subject.to_string(),
            reason: e.to_string(),
        },
    }
}
