//! The transports: how prefill results arrive and how outputs leave. They
//! know NATS and nothing of the contract: no decision, identity, metrics or
//! configuration is imported here; the pipeline passes plain values in.
//!
//! - [`Source`]: where deliveries come from, each admitted within the
//!   in-flight [`Limits`] (a count and a byte budget).
//! - [`Delivery`]: one prefill result, which can be settled (ack, nak with a
//!   delay, term), report progress while its output is confirmed, and tell
//!   its delivery attempt.
//! - [`Sink`]: where outputs go: published, and in JetStream mode confirmed.
//!
//! Two implementations:
//!
//! - [`core`]: core NATS, a queue subscription on every prefill subject (at
//!   most once, contract 7); its outputs are only enqueued on the connection.
//! - [`jetstream`]: the durable mode, a work-queue stream and a shared pull
//!   consumer; outputs are confirmed by the server before the delivery is
//!   acked.
//!
//! Beside them: [`connect`] (the one NATS connection a worker holds) and
//! [`budget`] (the byte budget both modes hold their results' bytes in).

pub mod budget;
pub mod connect;
pub mod core;
pub mod core_intake;
pub mod core_sink;
pub mod jetstream;

pub use connect::connect;
pub use core_intake::CoreSource;
pub use core_sink::CoreSink;

use async_nats::{HeaderMap, Subject};
use budget::{ByteBudget, Held};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
    settler: Settler,
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

/// How a delivery is settled with its transport.
enum Settler {
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
            jetstream::settle(acker, settle).await;
        }
    }

    /// Runs `work` (publishing this delivery's output), reporting progress
    /// to the server while it is pending so the delivery does not time out.
    pub async fn while_pending<F: Future>(&self, work: F) -> F::Output {
        match &self.settler {
            Settler::AtMostOnce => work.await,
            Settler::JetStream { acker, every } => {
                jetstream::with_progress(work, acker, *every).await
            }
        }
    }
}

/// The first value of the header `name`, matched without regard to case, as
/// HTTP and most NATS clients do. Every header read in this crate goes
/// through here.
pub fn first_header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?
        .iter()
        .find(|(n, _)| AsRef::<str>::as_ref(n).eq_ignore_ascii_case(name))
        .and_then(|(_, values)| values.first())
        .map(|v| v.as_str())
}

/// The in-flight bounds every source admits deliveries within, shared with
/// the runner that frees them: processing slots (`max_in_flight`) and bytes
/// (`max_in_flight_bytes`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub slots: Arc<Semaphore>,
    pub budget: ByteBudget,
}

impl Limits {
    pub fn new(max_in_flight: usize, max_in_flight_bytes: usize) -> Limits {
        // A semaphore counts in u32 when waiting for all permits at once.
        let slots = max_in_flight.clamp(1, u32::MAX as usize);
        Limits {
            slots: Arc::new(Semaphore::new(slots)),
            budget: ByteBudget::new(max_in_flight_bytes),
        }
    }
}

/// A delivery taken, holding its bytes (and, once given, its processing
/// slot) until dropped.
#[derive(Debug)]
pub struct Admitted {
    pub delivery: Delivery,
    pub held: Held,
    /// The processing slot, when the source took one before it pulled; the
    /// runner takes one otherwise.
    pub slot: Option<OwnedSemaphorePermit>,
}

/// What a source hands on.
#[derive(Debug)]
pub enum Admission {
    Admitted(Admitted),
    /// The byte budget had no room: the delivery, its payload already
    /// dropped (its length in `bytes`), must be answered without being
    /// decided.
    OverBudget {
        delivery: Delivery,
        bytes: usize,
    },
}

/// Where deliveries come from: one variant per delivery mode.
pub enum Source {
    Core(core_intake::CoreSource),
    JetStream(jetstream::PullSource),
}

impl Source {
    /// The next admission; `None` once the source is drained or closed and
    /// everything it took is handed on. Cancel-safe.
    pub async fn next(&mut self) -> Option<Admission> {
        match self {
            Source::Core(s) => s.next().await,
            Source::JetStream(s) => s.next().await,
        }
    }

    /// An admission already taken, if any; never waits.
    pub fn ready(&mut self) -> Option<Admission> {
        match self {
            Source::Core(s) => s.ready(),
            Source::JetStream(s) => s.ready(),
        }
    }

    /// Stops taking new input; what was already accepted still comes out of
    /// [`Source::next`], which then returns `None`.
    pub async fn drain(&mut self) {
        match self {
            Source::Core(s) => s.drain().await,
            Source::JetStream(s) => s.drain().await,
        }
    }
}

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

/// Where outputs go: one variant per delivery mode.
#[derive(Clone)]
pub enum Sink {
    /// Enqueued on the connection; pipelined, flushed at shutdown.
    Core(CoreSink),
    /// Known to have reached the server before the call returns.
    JetStream(Box<jetstream::publish::Publisher>),
}

impl Sink {
    /// Publishes one output. An empty header map publishes without headers.
    pub async fn publish(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
        target: Target,
    ) -> Result<(), PublishError> {
        match self {
            Sink::Core(sink) => sink.publish(subject, headers, payload).await,
            Sink::JetStream(sink) => match target {
                Target::Stream => sink.stored(subject, headers, payload).await,
                Target::Subject => sink.confirmed(subject, headers, payload).await,
            },
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

/// Why a transport could not be set up. Failures after start (disconnects,
/// publish errors) are logged and counted, not returned.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `nats.url` cannot be used (the message names the key).
    #[error(transparent)]
    Url(crate::config::ConfigError),
    #[error("nats.user and nats.password must be set together")]
    HalfUserPassword,
    #[error("nats.credentials_file {path:?} cannot be used: {reason}")]
    Credentials { path: String, reason: String },
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error(
        "cannot connect to NATS at {url}: no server answered within {secs} s (nats.connect_timeout_secs); check that nats-server runs there and is reachable"
    )]
    Unreachable { url: String, secs: u64 },
    #[error("TLS to NATS at {url} failed: {reason}")]
    Tls { url: String, reason: String },
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
    #[error("subjects.prefill_results is empty; the worker needs at least one subject to consume")]
    NoSubjects,
    #[error("cannot subscribe to {subject:?} (queue group {queue_group:?}): {reason}")]
    Subscribe {
        subject: String,
        queue_group: String,
        reason: String,
    },
}
