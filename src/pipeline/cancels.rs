//! The NATS side of cancellation: a plain subscription on the cancel subject
//! (not the queue group: every worker must hear every cancel), and in
//! JetStream mode the cancels the server kept, loaded before the worker
//! pulls.

use crate::cancel::{CancelError, Cancellations, Taken};
use crate::headers::{self, names::CONTENT_TYPE};
use crate::metrics::{CancelEvent, Metrics, RateLimitedLog};
use crate::wire::Encoding;
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Where cancels go: the worker's set and its metrics.
#[derive(Clone)]
pub struct Intake {
    pub cancellations: Arc<Cancellations>,
    pub metrics: Metrics,
    malformed_log: Arc<RateLimitedLog>,
}

impl Intake {
    pub fn new(cancellations: Arc<Cancellations>, metrics: Metrics) -> Intake {
        Intake {
            cancellations,
            metrics,
            malformed_log: Arc::default(),
        }
    }

    /// Takes one cancel message, published at `at_ms` (Unix ms), and counts
    /// what it did.
    pub fn take(&self, payload: &[u8], headers: Option<&HeaderMap>, at_ms: u64) {
        let taken = match headers::block_error(headers) {
            Some(what) => Taken::Malformed(CancelError::Undecodable {
                encoding: "a NATS message",
                why: format!("its header block could not be parsed: {what}"),
            }),
            None => {
                let content_type = headers::first(headers, CONTENT_TYPE);
                let encoding = Encoding::from_content_type(content_type);
                self.cancellations.take(payload, encoding, at_ms)
            }
        };
        let m = &self.metrics;
        match taken {
            Taken::Recorded { evicted, expired } => {
                m.cancels(CancelEvent::Recorded, 1);
                m.cancels(CancelEvent::Evicted, evicted);
                m.cancels(CancelEvent::Expired, expired);
            }
            Taken::Again { expired } => {
                m.cancels(CancelEvent::Again, 1);
                m.cancels(CancelEvent::Expired, expired);
            }
            Taken::Late => m.cancels(CancelEvent::Late, 1),
            Taken::Malformed(why) => {
                m.cancels(CancelEvent::Malformed, 1);
                if let Some(count) = self.malformed_log.due(Instant::now()) {
                    tracing::warn!(count, error = %why, "malformed cancel messages ignored");
                }
            }
        }
        m.cancels_held(self.cancellations.len());
    }
}

/// The subscription on the cancel subject, running until the worker stops.
pub struct Listener {
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot subscribe to the cancel subject {subject:?} (subjects.cancel): {why}")]
    Subscribe { subject: String, why: String },
    #[error("cannot load the cancels kept in stream {stream} (jetstream.cancel_stream): {why}")]
    Load { stream: String, why: String },
}

/// Subscribes to `subject` (every worker, no queue group) and takes each
/// cancel into `intake` as it comes; confirmed with the server before it
/// returns, so no cancel published afterwards is missed.
pub async fn listen(
    client: &Client,
    subject: &str,
    intake: Intake,
) -> Result<Listener, ListenError> {
    let failed = |why: String| ListenError::Subscribe {
        subject: subject.to_string(),
        why,
    };
    let mut cancels = client
        .subscribe(subject.to_string())
        .await
        .map_err(|e| failed(e.to_string()))?;
    crate::transport::round_trip(client)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let task = tokio::spawn(async move {
        while let Some(message) = cancels.next().await {
            intake.take(
                &message.payload,
                message.headers.as_ref(),
                crate::clock::unix_ms(),
            );
        }
    });
    Ok(Listener { task })
}

/// Reads every cancel `stream` keeps (those younger than its max age) into
/// `intake`, each at the time it was published; returns how many. Bounded
/// by `bound`: a stream that cannot be read in time is an error.
pub async fn load_kept(
    js: &async_nats::jetstream::Context,
    stream: &str,
    intake: &Intake,
    bound: Duration,
) -> Result<usize, ListenError> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
    let failed = |what: &str, e: &dyn std::fmt::Display| ListenError::Load {
        stream: stream.to_string(),
        why: format!("{what}: {e}"),
    };
    let load = async {
        let mut kept = js
            .get_stream(stream)
            .await
            .map_err(|e| failed("opening the stream", &e))?;
        let last = kept
            .info()
            .await
            .map_err(|e| failed("reading its state", &e))?
            .state
            .last_sequence;
        let count = kept.cached_info().state.messages;
        if count == 0 {
            return Ok(0);
        }
        let reader = kept
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| failed("creating a reader", &e))?;
        let mut messages = reader.messages().await.map_err(|e| failed("reading", &e))?;
        let mut loaded = 0;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| failed("reading", &e))?;
            let info = message.info().map_err(|e| failed("reading", &e))?;
            let at_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            let (sequence, pending) = (info.stream_sequence, info.pending);
            intake.take(&message.payload, message.headers.as_ref(), at_ms);
            loaded += 1;
            if pending == 0 || sequence >= last {
                break;
            }
        }
        Ok(loaded)
    };
    tokio::time::timeout(bound, load).await.unwrap_or_else(|_| {
        Err(ListenError::Load {
            stream: stream.to_string(),
            why: format!("not read within {} ms", bound.as_millis()),
        })
    })
}
