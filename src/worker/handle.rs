//! One prefill result, from bytes to its published output:
//! decode → decide → publish. Settling (ack) is the caller's, from the
//! [`Handled`] returned here.

use super::Worker;
use crate::decision::{self, DeadLetterCode, ErrorCode, Input, Outcome, TraceHeaders};
use crate::telemetry::{Delivery, ResultSpan, Telemetry};
use crate::transport::{self, Incoming, OutputError};
use crate::wire::Encoding;
use async_nats::{HeaderMap, HeaderValue};
use bytes::Bytes;
use tracing::Instrument as _;

/// What happened to one result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Its one output is published (enqueued on the connection).
    Published(Outcome),
    /// No output: it needs an ID while the worker holds no slot, and the
    /// transport will deliver it again (durable mode only).
    Deferred(Outcome),
    /// Its output could not be published; logged and counted.
    Failed(Outcome),
}

impl Worker {
    /// The result's span (`crate::telemetry`) around its handling: started
    /// at receipt, named by the output's `traceparent`, ended when handled.
    pub(super) async fn handle(&self, incoming: &Incoming) -> Handled {
        let mut trace = transport::trace_headers(incoming.headers.as_ref());
        let delivery = Delivery {
            subject: &incoming.subject,
            size: incoming.payload.len(),
            attempt: 1,
        };
        let mut span = Telemetry::result(
            self.telemetry.as_ref(),
            &trace,
            delivery,
            incoming.received_at,
        );
        span.propagate(&mut trace);
        let log = span.log_span();
        self.handle_traced(incoming, trace, &mut span)
            .instrument(log)
            .await
    }

    async fn handle_traced(
        &self,
        incoming: &Incoming,
        trace: TraceHeaders,
        span: &mut ResultSpan,
    ) -> Handled {
        let _in_flight = self.metrics.in_flight();
        let encoding = Encoding::from_content_type(incoming.content_type());
        let input = Input {
            payload: &incoming.payload,
            encoding,
            subject: &incoming.subject,
            nats_reply: incoming.nats_reply.as_deref(),
        };
        let headers = incoming.headers.as_ref();
        let decision =
            transport::offload::decide(input, headers, &self.rules, &mut self.identity.clone())
                .await;
        span.decided(&decision);
        let outcome = decision.outcome;
        let request_id = decision.request_id.as_deref();
        if self.options.defer_when_fenced
            && outcome
                == (Outcome::Error {
                    code: ErrorCode::IdentityUnavailable,
                })
        {
            tracing::debug!(?request_id, "no slot held: left for redelivery");
            span.not_published(&outcome, "no slot held: left for redelivery");
            return Handled::Deferred(outcome);
        }
        self.metrics.trace_headers_dropped(&trace.dropped);
        let headers = output_headers(&decision.headers, &trace);
        let payload = Bytes::from(decision.payload);
        let output_size = payload.len();
        let result = self
            .outbound
            .publish(&decision.subject, headers, payload)
            .await;
        let outcome = match result {
            Ok(()) => {
                span.published(&outcome, &decision.subject, output_size);
                outcome
            }
            Err(OutputError::TooLarge(why)) => {
                tracing::warn!(
                    kind = outcome.kind(),
                    ?request_id,
                    source = %incoming.subject,
                    error = %why,
                    "the output does not fit the server's max_payload; dead-lettering the input instead"
                );
                match self
                    .dead_letter_too_large(incoming, &trace, outcome.kind())
                    .await
                {
                    Ok(()) => {
                        let outcome = Outcome::DeadLetter {
                            code: DeadLetterCode::TooLarge,
                        };
                        let subject = &self.rules.dead_letter_subject;
                        span.published(&outcome, subject, incoming.payload.len());
                        outcome
                    }
                    Err(e) => return self.failed(outcome, request_id, incoming, &e, span),
                }
            }
            Err(e) => return self.failed(outcome, request_id, incoming, &e, span),
        };
        self.metrics.record(
            &outcome,
            decision.trailing_frames,
            incoming.received_at.elapsed(),
        );
        log_outcome(
            &outcome,
            request_id,
            &incoming.subject,
            decision.detail.as_deref(),
        );
        if decision.trailing_frames > 0 {
            tracing::debug!(
                ?request_id,
                trailing_frames = decision.trailing_frames,
                "frames after the first were ignored"
            );
        }
        Handled::Published(outcome)
    }

    fn failed(
        &self,
        outcome: Outcome,
        request_id: Option<&str>,
        incoming: &Incoming,
        error: &OutputError,
        span: &mut ResultSpan,
    ) -> Handled {
        self.metrics.publish_failed();
        span.not_published(&outcome, &error.to_string());
        tracing::error!(
            kind = outcome.kind(),
            ?request_id,
            source = %incoming.subject,
            %error,
            "could not publish the output; this result has none"
        );
        Handled::Failed(outcome)
    }

    /// The input's original bytes to the dead-letter subject, because its
    /// output would exceed the server's `max_payload`.
    async fn dead_letter_too_large(
        &self,
        incoming: &Incoming,
        trace: &TraceHeaders,
        kind: &str,
    ) -> Result<(), OutputError> {
        let why = format!(
            "the {kind} output for this result is larger than the NATS server's max_payload, so it could not be published"
        );
        let set = decision::dead_letter_headers(DeadLetterCode::TooLarge, &why, &incoming.subject);
        let headers = output_headers(&set, trace);
        let whole = self
            .outbound
            .publish(
                &self.rules.dead_letter_subject,
                headers,
                incoming.payload.clone(),
            )
            .await;
        let Err(OutputError::TooLarge(why)) = whole else {
            return whole;
        };
        // The input fits the server, but not with the dead letter's headers
        // added. The dead letter then goes without the input's bytes, saying
        // how many there were, rather than the result getting no output.
        tracing::warn!(
            bytes = incoming.payload.len(),
            source = %incoming.subject,
            error = %why,
            "the dead letter with the input's bytes does not fit either; dead-lettering without them"
        );
        let set = decision::without_payload(&set, incoming.payload.len());
        let headers = output_headers(&set, trace);
        self.outbound
            .publish(&self.rules.dead_letter_subject, headers, Bytes::new())
            .await
    }
}

fn log_outcome(outcome: &Outcome, request_id: Option<&str>, source: &str, detail: Option<&str>) {
    match outcome {
        Outcome::Decode { backend, minted } => {
            tracing::debug!(
                ?request_id,
                backend = backend.as_str(),
                minted,
                "decode job published"
            );
        }
        Outcome::Terminal { .. } => {
            tracing::debug!(?request_id, "terminal response published");
        }
        Outcome::Error { code } => {
            tracing::info!(
                code = code.as_str(),
                ?request_id,
                %source,
                detail = ?detail,
                "error response published"
            );
        }
        Outcome::DeadLetter { code } => {
            tracing::warn!(
                code = code.as_str(),
                %source,
                detail = ?detail,
                "dead letter published"
            );
        }
    }
}

/// The output's headers: the decision's own, plus the input's trace headers
/// that passed [`decision::trace_headers`]. `None` when there are none, so
/// the plain publish path is used.
pub(super) fn output_headers(
    set: &[(&'static str, String)],
    trace: &TraceHeaders,
) -> Option<HeaderMap> {
    if set.is_empty() && trace.is_empty() {
        return None;
    }
    let mut headers = HeaderMap::new();
    for (name, value) in set.iter().chain(&trace.copy) {
        headers.insert(*name, header_value(value));
    }
    Some(headers)
}

/// A header value; line breaks (which cannot stand in a header) become spaces.
fn header_value(value: &str) -> HeaderValue {
    value
        .parse()
        .unwrap_or_else(|_| HeaderValue::from(value.replace(['\r', '\n'], " ")))
}
