//! Where outputs go: one [`Sink`], enqueued (core NATS) or confirmed
//! (JetStream).

use super::{CoreSink, jetstream};
use async_nats::HeaderMap;
use async_nats::message::OutboundMessage;
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
}

/// Whether an output goes into a stream (waiting for its stored ack) or
/// onto a plain subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Subject,
    Stream,
}

/// A publish under way ([`Sink::publish`]): done at once (kept, or
/// refused), or waiting on the server.
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
    /// In core mode, inside a batch (`core_sink::gather`), it is kept (when
    /// called, not when awaited) and goes out with the batch's other outputs
    /// at the batch's end.
    ///
    /// Not an `async fn`: as one, the futures it awaits made every result's
    /// future 3.3 KB (`-Zprint-type-sizes`), in both modes, and that future
    /// is moved several times per result. What waits on the server is boxed
    /// instead: allocated once per result in JetStream mode, and in core
    /// mode only on the rare path `send_now` takes.
    pub fn publish<'a>(
        &'a self,
        subject: &'a str,
        headers: HeaderMap,
        payload: Bytes,
        target: Target,
    ) -> Publishing<'a> {
        match self {
            Sink::Core(sink) => match sink.keep(subject, headers, payload) {
                Ok(None) => Either::Left(ready(Ok(()))),
                Ok(Some(message)) => Either::Right(Box::pin(sink.send_now(subject, message))),
                Err(e) => Either::Left(ready(Err(e))),
            },
            Sink::JetStream(sink) => Either::Right(match target {
                Target::Stream => Box::pin(sink.stored(subject, headers, payload)),
                Target::Subject => Box::pin(sink.confirmed(subject, headers, payload)),
            }),
        }
    }

    /// Sends the outputs a batch kept (`core_sink::gather`, core mode only).
    /// `Err` with how many could not be sent.
    pub async fn send_kept(&self, kept: Vec<OutboundMessage>) -> Result<(), usize> {
        match self {
            Sink::Core(sink) => sink.send_kept(kept).await,
            // Its publishes are never kept: nothing to send.
            Sink::JetStream(_) => Ok(()),
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
