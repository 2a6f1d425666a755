//! One delivered message: decode → decide → publish → settle.
//!
//! The message is acked only after its output is known to have reached the
//! server: for decode jobs into the GEN stream, the stream's publish ack (the
//! job is stored; `Nats-Msg-Id` makes a redelivered duplicate a no-op); for
//! replies and dead letters, a confirmed core publish (see [`publish_confirmed`]).
//! While waiting, in-progress acks keep the delivery from timing out.

use super::settle::{self, Plan, Redelivery, Settle};
use crate::decision::{self, Decision, Input, Outcome, Rules};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::wire::Encoding;
use async_nats::jetstream::{
    self, AckKind,
    message::{Acker, PublishMessage},
};
use async_nats::{Client, HeaderMap, RequestErrorKind};
use bytes::Bytes;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Input headers copied to every output (contract 3).
const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Everything a delivery needs, shared by all in-flight messages.
pub struct Handler {
    pub client: Client,
    pub js: jetstream::Context,
    pub rules: Rules,
    pub identity: Identity,
    pub metrics: Metrics,
    /// Decode jobs go into the GEN stream and wait for its ack.
    pub gen_is_stream: bool,
    pub redelivery: Redelivery,
    /// The consumer's ack wait: in-progress acks are sent every half of it.
    pub ack_wait: Duration,
}

/// What happened to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The output was published and the delivery acked or terminated.
    Done { outcome: Outcome, settle: Settle },
    /// Nothing was published (no identity to mint with); redelivery asked for.
    Retry { delay: Duration },
    /// Publishing failed; redelivery asked for.
    PublishFailed { delay: Duration },
}

/// Why an output could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("publish failed: {0}")]
    Send(String),
    #[error("the GEN stream did not store the decode job: {0}")]
    NotStored(String),
    #[error("the server did not confirm receipt: {0}")]
    Unconfirmed(String),
    #[error("the NATS connection was re-established while publishing; the output may be lost")]
    Reconnected,
}

impl Handler {
    /// Handles one delivery to the end. Never panics on the message's content.
    pub async fn handle(&self, message: jetstream::Message, received_at: Instant) -> Handled {
        // The delivery count is in the ack subject; a message without one
        // cannot come from a consumer, but counts as a first delivery.
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
        let (message, acker) = message.split();
        let in_headers = message.headers.as_ref();
        let content_type = in_headers
            .and_then(|h| h.get("Content-Type"))
            .map(|v| v.as_str());
        let input = Input {
            payload: &message.payload,
            encoding: Encoding::from_content_type(content_type),
            subject: message.subject.as_str(),
            nats_reply: None,
        };
        let mut decision = decision::decide(input, &self.rules, &mut self.identity.clone());

        let settle = match settle::plan(&decision.outcome, delivered, &self.redelivery) {
            Plan::Retry(delay) => {
                debug!(
                    request_id = decision.request_id.as_deref().unwrap_or(""),
                    delivered,
                    delay_ms = delay.as_millis() as u64,
                    "no machine-ID slot to mint with; asking for redelivery"
                );
                nak(&acker, delay).await;
                return Handled::Retry { delay };
            }
            Plan::Publish(settle) => settle,
        };

        let headers = output_headers(&decision, in_headers);
        let payload = Bytes::from(std::mem::take(&mut decision.payload));
        let stored = self.gen_is_stream && matches!(decision.outcome, Outcome::Decode { .. });
        let publish = async {
            if stored {
                self.publish_stored(&decision.subject, headers, payload)
                    .await
            } else {
                self.publish_confirmed(&decision.subject, headers, payload)
                    .await
            }
        };
        if let Err(e) = with_progress(publish, &acker, self.ack_wait / 2).await {
            let delay = self.redelivery.delay(delivered);
            warn!(
                request_id = decision.request_id.as_deref().unwrap_or(""),
                subject = %decision.subject,
                delivered,
                last_delivery = self.redelivery.is_last(delivered),
                error = %e,
                "output not confirmed; asking for redelivery"
            );
            nak(&acker, delay).await;
            return Handled::PublishFailed { delay };
        }

        self.metrics.record(
            &decision.outcome,
            decision.trailing_frames,
            received_at.elapsed(),
        );
        log_outcome(&decision, message.subject.as_str(), delivered);
        let kind = match settle {
            Settle::Ack => AckKind::Ack,
            Settle::Term => AckKind::Term,
        };
        if let Err(e) = acker.double_ack_with(kind).await {
            // The output is out; the message may come again and its output
            // repeat (GEN drops the duplicate decode job).
            warn!(
                request_id = decision.request_id.as_deref().unwrap_or(""),
                error = %e,
                "the server did not confirm the ack; the message may be redelivered"
            );
        }
        Handled::Done {
            outcome: decision.outcome,
            settle,
        }
    }

    /// Publishes into the GEN stream and waits for the stream's ack.
    async fn publish_stored(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let ack = self
            .js
            .send_publish(
                subject.to_string(),
                PublishMessage::build().payload(payload).headers(headers),
            )
            .await
            .map_err(|e| PublishError::Send(e.to_string()))?;
        let ack = ack
            .await
            .map_err(|e| PublishError::NotStored(e.to_string()))?;
        if ack.duplicate {
            debug!(
                subject,
                sequence = ack.sequence,
                "GEN stream dropped a duplicate decode job"
            );
        }
        Ok(())
    }

    /// Publishes a core message and confirms the server received it.
    ///
    /// Core NATS has no publish ack. What it does have: a request to a
    /// subject nobody listens on is answered by the server itself ("no
    /// responders") after it has processed everything this connection sent
    /// before it — the same guarantee as a PING/PONG flush. If the connection
    /// was not re-established meanwhile, the publish reached the server.
    async fn publish_confirmed(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let connects = self.client.statistics().connects.load(Ordering::Acquire);
        self.client
            .publish_with_headers(subject.to_string(), headers, payload)
            .await
            .map_err(|e| PublishError::Send(e.to_string()))?;
        let probe = self.client.new_inbox();
        match self.client.request(probe, Bytes::new()).await {
            Ok(_) => {}
            Err(e) if e.kind() == RequestErrorKind::NoResponders => {}
            Err(e) => return Err(PublishError::Unconfirmed(e.to_string())),
        }
        if self.client.statistics().connects.load(Ordering::Acquire) != connects {
            return Err(PublishError::Reconnected);
        }
        Ok(())
    }
}

/// Asks for redelivery after `delay`. If the nak is lost, the ack wait
/// expires and the message comes again anyway.
async fn nak(acker: &Acker, delay: Duration) {
    if let Err(e) = acker.ack_with(AckKind::Nak(Some(delay))).await {
        debug!(error = %e, "nak not sent; the message is redelivered after the ack wait");
    }
}

/// Runs `work`, sending an in-progress ack every `every` while it is pending.
async fn with_progress<F: Future>(work: F, acker: &Acker, every: Duration) -> F::Output {
    let every = every.max(Duration::from_millis(100));
    tokio::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = ticks.tick() => {
                if let Err(e) = acker.ack_with(AckKind::Progress).await {
                    debug!(error = %e, "in-progress ack not sent");
                }
            }
        }
    }
}

/// The decision's headers plus the input's trace headers.
pub fn output_headers(decision: &Decision, input: Option<&HeaderMap>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &decision.headers {
        headers.insert(*name, value.as_str());
    }
    if let Some(input) = input {
        for name in TRACE_HEADERS {
            if let Some(value) = input.get(name) {
                headers.insert(name, value.as_str());
            }
        }
    }
    headers
}

fn log_outcome(decision: &Decision, source: &str, delivered: i64) {
    let request_id = decision.request_id.as_deref().unwrap_or("");
    let detail = decision.detail.as_deref().unwrap_or("");
    match &decision.outcome {
        Outcome::DeadLetter { code } => warn!(
            code = code.as_str(),
            source, delivered, detail, "dead-lettered and terminated"
        ),
        Outcome::Error { code } => info!(
            code = code.as_str(),
            request_id, delivered, detail, "error response sent"
        ),
        Outcome::Decode { .. } | Outcome::Terminal { .. } => debug!(
            outcome = decision.outcome.kind(),
            request_id,
            delivered,
            trailing_frames = decision.trailing_frames,
            "published"
        ),
    }
}
