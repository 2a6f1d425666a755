//! Publishing an output so that the input may be acked afterwards: the
//! publish must be known to have reached the server.
//!
//! - Into a stream (decode jobs, when GEN is a stream): the stream's publish
//!   ack says the job is stored. `Nats-Msg-Id` makes a repeat a no-op.
//! - Core NATS (replies, dead letters): there is no publish ack, so a
//!   round trip follows the publish (see [`Publisher::confirmed`]).

use super::confirm::Confirmer;
use crate::transport::publish_error::{PublishError, publish_error};
use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::{Client, HeaderMap};
use bytes::Bytes;
use std::sync::atomic::Ordering;

fn failed(subject: &str, reason: impl std::fmt::Display) -> PublishError {
    PublishError::Failed {
        subject: subject.to_string(),
        reason: reason.to_string(),
    }
}

/// Whether a stream's publish ack says it could not store the message
/// (error 10077, "maximum messages exceeded", "maximum bytes exceeded", or
/// its store failing), as opposed to the publish not reaching it.
fn store_refused(e: &jetstream::context::PublishError) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .is_some_and(|api| api.error_code() == jetstream::ErrorCode::STREAM_STORE_FAILED)
}

/// The one connection outputs go out on.
#[derive(Clone)]
pub struct Publisher {
    pub client: Client,
    pub js: jetstream::Context,
    /// Confirms core publishes, one probe for all enqueued before it.
    pub confirmer: Confirmer,
}

impl Publisher {
    /// Publishes into a stream and waits for the stream's ack. A duplicate
    /// (same `Nats-Msg-Id` within the window) is acked too: the job is stored.
    pub async fn stored(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        use jetstream::context::PublishErrorKind as Kind;
        let ack = self
            .js
            .send_publish(
                subject.to_string(),
                PublishMessage::build().payload(payload).headers(headers),
            )
            .await
            .map_err(|e| match e.kind() {
                Kind::MaxPayloadExceeded => PublishError::TooLarge(e.to_string()),
                _ => failed(subject, &e),
            })?;
        let ack = ack.await.map_err(|e| {
            if store_refused(&e) {
                return PublishError::Refused {
                    subject: subject.to_string(),
                    reason: e.to_string(),
                };
            }
            failed(
                subject,
                format_args!("the GEN stream did not store the decode job: {e}"),
            )
        })?;
        if ack.duplicate {
            tracing::debug!(
                subject,
                sequence = ack.sequence,
                "the GEN stream already held this decode job"
            );
        }
        Ok(())
    }

    /// Publishes a core message and confirms the server received it: a probe
    /// round trip enqueued after it ([`Confirmer`], shared by concurrent
    /// publishes). If the connection was not re-established in between, the
    /// publish reached the server; otherwise it may be lost, and the caller
    /// asks for redelivery (the output may then repeat, never go missing).
    pub async fn confirmed(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let connects = self.connects();
        self.client
            .publish_with_headers(subject.to_string(), headers, payload)
            .await
            .map_err(|e| publish_error(subject, &e))?;
        self.confirmer
            .confirm()
            .await
            .map_err(|e| failed(subject, e))?;
        if self.connects() != connects {
            return Err(failed(
                subject,
                "the NATS connection was re-established meanwhile; the output may be lost",
            ));
        }
        Ok(())
    }

    /// Whether `stream` holds a message on `subject` with the header
    /// `Nats-Msg-Id: msg_id`, stored at or after `since`: a read of the
    /// message headers since then (an ordered consumer, headers only), given
    /// up after `bound`. Used only for a decode job redelivered so late that
    /// the stream's duplicate window may no longer remember its first copy.
    pub async fn holds(
        &self,
        stream: &str,
        subject: &str,
        msg_id: &str,
        since: time::OffsetDateTime,
        bound: std::time::Duration,
    ) -> Result<bool, PublishError> {
        use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
        use futures::StreamExt;
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            failed(
                subject,
                format_args!("reading {stream} for {msg_id}: {what}: {e}"),
            )
        };
        let scan = async {
            let mut gen_stream = self
                .js
                .get_stream(stream)
                .await
                .map_err(|e| failed("opening the stream", &e))?;
            let state = gen_stream
                .info()
                .await
                .map_err(|e| failed("reading its state", &e))?
                .state
                .clone();
            if state.messages == 0 || state.last_timestamp < since {
                return Ok(false);
            }
            let consumer = gen_stream
                .create_consumer(OrderedConfig {
                    filter_subject: subject.to_string(),
                    headers_only: true,
                    deliver_policy: DeliverPolicy::ByStartTime { start_time: since },
                    ..Default::default()
                })
                .await
                .map_err(|e| failed("creating a reader", &e))?;
            let mut messages = consumer
                .messages()
                .await
                .map_err(|e| failed("reading", &e))?;
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| failed("reading", &e))?;
                let same = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .is_some_and(|v| v.as_str() == msg_id);
                if same {
                    return Ok(true);
                }
                let info = message.info().map_err(|e| failed("reading", &e))?;
                if info.pending == 0 || info.stream_sequence >= state.last_sequence {
                    return Ok(false);
                }
            }
            Ok(false)
        };
        tokio::time::timeout(bound, scan).await.unwrap_or_else(|_| {
            Err(failed(
                subject,
                &format_args!(
                    "reading {stream} for {msg_id} took longer than {} ms",
                    bound.as_millis()
                ),
            ))
        })
    }

    /// How many times the connection has been established so far.
    pub fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Acquire)
    }
}
