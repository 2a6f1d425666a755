//! One delivered message: decode → decide → publish → settle.
//!
//! The message is acked only after its output is known to have reached the
//! server ([`Publisher`]); while waiting, in-progress acks keep the delivery
//! from timing out. Which settlement follows is [`settle`]'s rule.

use super::publish::{PublishError, Publisher};
use super::settle::{self, Plan, Redelivery, Settle};
use crate::decision::{self, DeadLetterCode, Decision, Input, Outcome, Rules, TraceHeaders};
use crate::identity::Identity;
use crate::metrics::{Metrics, NakReason};
use crate::telemetry::{Delivery, ResultSpan, Telemetry};
use crate::wire::Encoding;
use async_nats::jetstream::{self, AckKind, message::Acker};
use async_nats::{HeaderMap, Message};
use bytes::Bytes;
use std::future::Future;
use std::time::{Duration, Instant};
use tracing::{Instrument as _, debug, error, info, warn};

/// Everything a delivery needs, shared by all in-flight messages.
pub struct Handler {
    pub publisher: Publisher,
    pub rules: Rules,
    pub identity: Identity,
    pub metrics: Metrics,
    /// Decode jobs go into the GEN stream and wait for its ack.
    pub gen_is_stream: bool,
    pub redelivery: Redelivery,
    /// The consumer's ack wait: in-progress acks are sent every half of it.
    pub ack_wait: Duration,
    /// The GEN stream, for late redeliveries (`None` unless GEN is a stream).
    pub gen_stream: Option<GenStream>,
    /// `None`: no tracing, and no span built per delivery.
    pub telemetry: Option<Telemetry>,
}

/// What a late redelivery needs to know of the GEN stream.
pub struct GenStream {
    pub name: String,
    /// Its duplicate window as the server holds it.
    pub duplicate_window: Duration,
}

impl GenStream {
    /// Whether a decode job first handled at `published` (the prefill
    /// result's store time) may have left the duplicate window by now. Half
    /// the window: a margin for the clocks of server and worker.
    fn may_have_forgotten(&self, published: time::OffsetDateTime) -> bool {
        let age = time::OffsetDateTime::now_utc() - published;
        age >= self.duplicate_window / 2
    }
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
    /// Neither the output nor a dead letter could ever be published:
    /// terminated, logged as an error.
    Unpublishable,
}

impl Handler {
    /// Handles one delivery to the end. Never panics on the message's content.
    /// Its span (`crate::telemetry`) starts at receipt and ends after settling.
    pub async fn handle(&self, message: jetstream::Message, received_at: Instant) -> Handled {
        // The delivery count is in the ack subject; a message without one
        // cannot come from a consumer, but counts as a first delivery.
        let (delivered, published) = message
            .info()
            .map_or((1, None), |i| (i.delivered, Some(i.published)));
        let (message, acker) = message.split();
        let mut trace = crate::transport::trace_headers(message.headers.as_ref());
        let delivery = Delivery {
            subject: message.subject.as_str(),
            size: message.payload.len(),
            attempt: delivered,
        };
        let mut span = Telemetry::result(self.telemetry.as_ref(), &trace, delivery, received_at);
        span.propagate(&mut trace);
        let log = span.log_span();
        let delivery = (message, acker, delivered, published);
        self.handle_traced(delivery, trace, &mut span, received_at)
            .instrument(log)
            .await
    }

    async fn handle_traced(
        &self,
        (message, acker, delivered, published): (Message, Acker, i64, Option<time::OffsetDateTime>),
        trace: TraceHeaders,
        span: &mut ResultSpan,
        received_at: Instant,
    ) -> Handled {
        let _in_flight = self.metrics.in_flight();
        if delivered > 1 {
            self.metrics.redelivered();
        }
        let input = Input {
            payload: &message.payload,
            encoding: Encoding::from_content_type(crate::transport::first_header(
                message.headers.as_ref(),
                "content-type",
            )),
            subject: message.subject.as_str(),
            nats_reply: None,
        };
        let headers = message.headers.as_ref();
        let mut decision = crate::transport::offload::decide(
            input,
            headers,
            &self.rules,
            &mut self.identity.clone(),
        )
        .await;
        let request_id = decision.request_id.clone().unwrap_or_default();
        span.decided(&decision);

        let settle = match settle::plan(&decision.outcome, delivered, &self.redelivery) {
            Plan::Retry(delay) => {
                debug!(
                    request_id,
                    delivered,
                    delay_ms = delay.as_millis() as u64,
                    "no machine-ID slot to mint with; asking for redelivery"
                );
                self.metrics.nacked(NakReason::IdentityUnavailable);
                nak(&acker, delay).await;
                span.not_published(&decision.outcome, "no slot held: redelivery asked for");
                span.settled("nak");
                return Handled::Retry { delay };
            }
            Plan::Publish(settle) => settle,
        };

        self.metrics.trace_headers_dropped(&trace.dropped);
        let headers = output_headers(&decision.headers, &trace);
        let payload = Bytes::from(std::mem::take(&mut decision.payload));
        let output_size = payload.len();
        let stored = self.gen_is_stream && matches!(decision.outcome, Outcome::Decode { .. });
        // A decode job redelivered after its first copy may have left the
        // GEN stream's duplicate window (workers were away longer than the
        // window, so the redelivery came late): Nats-Msg-Id would no longer
        // drop a second copy, so look for the first one before publishing.
        let late = match (&self.gen_stream, published) {
            (Some(gen_stream), Some(published)) if stored && delivered > 1 => gen_stream
                .may_have_forgotten(published)
                .then_some((gen_stream, published)),
            _ => None,
        };
        let msg_id = headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let publish = async {
            if let Some((gen_stream, published)) = late {
                let held = self
                    .publisher
                    .holds(
                        &gen_stream.name,
                        &decision.subject,
                        &msg_id,
                        published,
                        self.ack_wait / 2,
                    )
                    .await?;
                if held {
                    info!(
                        request_id,
                        delivered, "late redelivery: the GEN stream already holds this decode job"
                    );
                    return Ok(());
                }
            }
            if stored {
                self.publisher
                    .stored(&decision.subject, headers, payload)
                    .await
            } else {
                self.publisher
                    .core(&decision.subject, headers, payload)
                    .await
            }
        };
        let (outcome, settle) = match with_progress(publish, &acker, self.ack_wait / 2).await {
            Ok(()) => {
                span.published(&decision.outcome, &decision.subject, output_size);
                (decision.outcome.clone(), settle)
            }
            Err(PublishError::Permanent { code, why }) => {
                match self
                    .dead_letter_instead(&message, &trace, &acker, &decision, code, &why)
                    .await
                {
                    Ok(code) => {
                        let outcome = Outcome::DeadLetter { code };
                        let subject = &self.rules.dead_letter_subject;
                        span.published(&outcome, subject, message.payload.len());
                        (outcome, Settle::Term)
                    }
                    Err(e) => {
                        span.not_published(&decision.outcome, &e.to_string());
                        return self.failed(&acker, &request_id, delivered, e, span).await;
                    }
                }
            }
            Err(e) => {
                span.not_published(&decision.outcome, &e.to_string());
                return self.failed(&acker, &request_id, delivered, e, span).await;
            }
        };

        self.metrics
            .record(&outcome, decision.trailing_frames, received_at.elapsed());
        log_outcome(&outcome, &decision, message.subject.as_str(), delivered);
        let kind = match settle {
            Settle::Ack => AckKind::Ack,
            Settle::Term => AckKind::Term,
        };
        // A plain ack, not a confirmed one: confirming would cost a round
        // trip per message and change nothing, since a lost ack means the
        // same either way (the message comes again and its output repeats;
        // the GEN stream drops a repeated decode job). Shutdown flushes the
        // connection, so acks taken before it reach the server.
        if let Err(e) = acker.ack_with(kind).await {
            warn!(
                request_id,
                error = %e,
                "the ack could not be sent; the message will be redelivered"
            );
        }
        span.settled(match settle {
            Settle::Ack => "ack",
            Settle::Term => "term",
        });
        Handled::Done { outcome, settle }
    }

    /// The output can never be published (too large for the server): the
    /// input goes to the dead-letter subject instead, as it came.
    async fn dead_letter_instead(
        &self,
        message: &Message,
        trace: &TraceHeaders,
        acker: &Acker,
        decision: &Decision,
        code: DeadLetterCode,
        why: &str,
    ) -> Result<DeadLetterCode, PublishError> {
        warn!(
            kind = decision.outcome.kind(),
            request_id = decision.request_id.as_deref().unwrap_or(""),
            error = why,
            "the output cannot be published; dead-lettering the input instead"
        );
        let set = decision::dead_letter_headers(
            code,
            &format!(
                "the {} output for this result could not be published: {why}",
                decision.outcome.kind()
            ),
            &message.subject,
        );
        let headers = output_headers(&set, trace);
        let publish = self.publisher.core(
            &self.rules.dead_letter_subject,
            headers,
            message.payload.clone(),
        );
        match with_progress(publish, acker, self.ack_wait / 2).await {
            Err(PublishError::Permanent {
                code: DeadLetterCode::TooLarge,
                why,
            }) => {
                // The input fits the server, but not with the dead letter's
                // headers added: the dead letter goes without its bytes,
                // saying how many there were, rather than no output at all.
                warn!(
                    bytes = message.payload.len(),
                    error = why,
                    "the dead letter with the input's bytes does not fit either; dead-lettering without them"
                );
                let set = decision::without_payload(&set, message.payload.len());
                let headers = output_headers(&set, trace);
                let publish =
                    self.publisher
                        .core(&self.rules.dead_letter_subject, headers, Bytes::new());
                with_progress(publish, acker, self.ack_wait / 2).await?;
            }
            other => other?,
        }
        Ok(code)
    }

    async fn failed(
        &self,
        acker: &Acker,
        request_id: &str,
        delivered: i64,
        e: PublishError,
        span: &mut ResultSpan,
    ) -> Handled {
        self.metrics.publish_failed();
        if e.is_permanent() {
            error!(
                request_id,
                error = %e,
                "neither the output nor a dead letter can be published; terminating the message"
            );
            if let Err(e) = acker.ack_with(AckKind::Term).await {
                debug!(error = %e, "term not sent");
            }
            span.settled("term");
            return Handled::Unpublishable;
        }
        let delay = self.redelivery.delay(delivered);
        warn!(
            request_id,
            delivered,
            last_delivery = self.redelivery.is_last(delivered),
            error = %e,
            "output not confirmed; asking for redelivery"
        );
        self.metrics.nacked(NakReason::PublishFailed);
        nak(acker, delay).await;
        span.settled("nak");
        Handled::PublishFailed { delay }
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

/// The given headers plus the input's trace headers that passed
/// [`decision::trace_headers`].
pub fn output_headers(set: &[(&'static str, String)], trace: &TraceHeaders) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in set.iter().chain(&trace.copy) {
        headers.insert(*name, value.as_str());
    }
    headers
}

fn log_outcome(outcome: &Outcome, decision: &Decision, source: &str, delivered: i64) {
    let request_id = decision.request_id.as_deref().unwrap_or("");
    let detail = decision.detail.as_deref().unwrap_or("");
    match outcome {
        Outcome::DeadLetter { code } => warn!(
            code = code.as_str(),
            source, delivered, detail, "dead-lettered and terminated"
        ),
        Outcome::Error { code } => info!(
            code = code.as_str(),
            request_id, delivered, detail, "error response published"
        ),
        Outcome::Decode { .. } | Outcome::Terminal { .. } => debug!(
            outcome = outcome.kind(),
            request_id,
            delivered,
            trailing_frames = decision.trailing_frames,
            "published"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_headers_add_the_trace_headers_under_their_canonical_names() {
        let mut input = HeaderMap::new();
        input.insert(
            "TraceParent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        input.insert("tracestate", "k=v");
        input.insert("Content-Type", "application/json");
        input.insert("Nats-Msg-Id", "from-the-producer");
        let set = [("Nats-Msg-Id", "handoff-r1".to_string())];
        let trace = crate::transport::trace_headers(Some(&input));
        let out = output_headers(&set, &trace);
        let mut got: Vec<(String, String)> = out
            .iter()
            .map(|(n, v)| (n.to_string(), v[0].as_str().to_string()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("Nats-Msg-Id".into(), "handoff-r1".into()),
                (
                    "traceparent".into(),
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()
                ),
                ("tracestate".into(), "k=v".into()),
            ]
        );
        let none = crate::transport::trace_headers(None);
        assert_eq!(output_headers(&set, &none).iter().count(), 1);
    }
}
