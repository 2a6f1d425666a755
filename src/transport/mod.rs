//! The transports: how prefill results arrive and how outputs leave.
//!
//! - [`connect`]: the one NATS connection a worker holds (URLs, auth, client
//!   name, reconnect logging).
//! - [`core`]: core NATS, a queue subscription on every prefill subject (at
//!   most once, contract 7).
//! - [`outbound`]: publishing an output.
//! - [`ack`]: what is done with an input once its output is out (nothing in
//!   core mode; ack, nak or term in JetStream mode).
//! - [`jetstream`]: the durable mode, a work-queue stream and a shared pull
//!   consumer, with its own pull loop and confirmed publishes (`run` calls
//!   [`jetstream::serve`] instead of the core worker loop).
//!
//! The core worker sees its transport through [`Inbound`] and [`Incoming`];
//! a new at-most-once mode adds a variant to [`Inbound`] and one to [`Ack`].
//! The durable mode is different enough to own its loop: each output must be
//! confirmed by the server before the message is acked, slow confirmations
//! send in-progress acks, and naks back off by delivery count. It shares the
//! decision core, and its ack/nak/term rules live in `jetstream::settle`.

pub mod ack;
pub mod connect;
pub mod core;
mod header_block;
pub mod jetstream;
pub mod outbound;

pub use ack::{Ack, Settlement};
pub use connect::connect;
pub use header_block::decide;
pub use outbound::{Outbound, OutputError};

use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use std::time::Instant;

/// One received prefill result, whatever transport it came from.
#[derive(Debug)]
pub struct Incoming {
    /// The subject it arrived on.
    pub subject: Subject,
    pub payload: Bytes,
    pub headers: Option<HeaderMap>,
    /// The NATS message's own reply subject. In core mode a request's answer
    /// may go there; in JetStream mode it is the ack subject and never used.
    pub nats_reply: Option<Subject>,
    /// When the worker took it from the transport; latency is measured from here.
    pub received_at: Instant,
    /// How to settle it once its output is published.
    pub ack: Ack,
}

impl Incoming {
    /// The value of the `Content-Type` header, if any. Header names are
    /// matched without regard to case, as HTTP and most NATS clients do.
    pub fn content_type(&self) -> Option<&str> {
        self.headers
            .as_ref()?
            .iter()
            .find(|(name, _)| AsRef::<str>::as_ref(name).eq_ignore_ascii_case("content-type"))
            .and_then(|(_, values)| values.first())
            .map(|v| v.as_str())
    }
}

/// Where prefill results come from: one variant per delivery mode.
///
/// `next` must be cancel-safe (the worker polls it inside `select!`): a
/// result it has not returned yet must still be there on the next call.
pub enum Inbound {
    Core(core::CoreInbound),
}

impl Inbound {
    /// The next result; `None` once the transport is drained or closed.
    pub async fn next(&mut self) -> Option<Incoming> {
        match self {
            Inbound::Core(inbound) => inbound.next().await,
        }
    }

    /// Stops taking new input. Results already accepted still come out of
    /// [`Inbound::next`], which returns `None` once they are all out.
    pub async fn drain(&mut self) {
        match self {
            Inbound::Core(inbound) => inbound.drain().await,
        }
    }
}

/// Why a transport could not be set up. Failures after start (disconnects,
/// publish errors) are logged and counted, not returned.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("nats.url: {url:?} is not a NATS server URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("nats.url is empty; expected one or more comma-separated NATS server URLs")]
    NoUrl,
    #[error("nats.user and nats.password must be set together")]
    HalfUserPassword,
    #[error("nats.credentials_file {path:?} cannot be used: {reason}")]
    Credentials { path: String, reason: String },
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("subjects.prefill_results is empty; the worker needs at least one subject to consume")]
    NoSubjects,
    #[error("cannot subscribe to {subject:?} (queue group {queue_group:?}): {reason}")]
    Subscribe {
        subject: String,
        queue_group: String,
        reason: String,
    },
}
