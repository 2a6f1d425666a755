//! One result's span: started at delivery, ended after settling, with the
//! stages (decided, published, settled) as events and what happened as
//! attributes.
//!
//! A [`ResultSpan`] of a worker without tracing holds nothing: every method
//! is one branch on `None`, and nothing is allocated or built. An unsampled
//! span (the parent said so, or the root ratio) exists only to name itself
//! in the outgoing `traceparent`; it records nothing and is never exported.

use super::context;
use crate::decision::{Decision, Outcome};
use crate::headers::TraceHeaders;
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, SpanContext, Status};
use opentelemetry_sdk::trace::Span;

/// Attribute names. `messaging.*` follow OpenTelemetry's messaging semantic
/// conventions; `handoff.*` are this worker's own.
pub mod attr {
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
    pub const MESSAGING_DESTINATION: &str = "messaging.destination.name";
    pub const MESSAGING_BODY_SIZE: &str = "messaging.message.body.size";
    pub const DELIVERY_ATTEMPT: &str = "handoff.delivery_attempt";
    pub const MACHINE_ID: &str = "handoff.machine_id";
    pub const REQUEST_ID: &str = "handoff.request_id";
    pub const OUTCOME: &str = "handoff.outcome";
    pub const BACKEND: &str = "handoff.backend";
    pub const MINTED: &str = "handoff.minted";
    pub const FINISH_REASON: &str = "handoff.finish_reason";
    pub const ERROR_CODE: &str = "handoff.error_code";
    pub const DEAD_LETTER_CODE: &str = "handoff.dead_letter_code";
    pub const OUTPUT_SUBJECT: &str = "handoff.output.subject";
    pub const OUTPUT_SIZE: &str = "handoff.output.size";
    pub const SETTLE: &str = "handoff.settle";
}

/// The span's name: one per result, whatever the subject (a name per
/// subject would multiply the collector's span names by the wildcards).
pub const RESULT_SPAN: &str = "handoff.result";

/// Where a result came from, for the span's first attributes.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// The subject it arrived on.
    pub subject: &'a str,
    /// Its bytes.
    pub size: usize,
    /// 1 for the first delivery (always 1 in core mode).
    pub attempt: i64,
}

/// The span of one result; see the module documentation.
pub struct ResultSpan {
    /// `None` without tracing. Boxed: the SDK's span is a few hundred
    /// bytes, and every result's future would carry them.
    span: Option<Box<Span>>,
}

impl ResultSpan {
    /// The span of a worker without tracing.
    pub const fn none() -> ResultSpan {
        ResultSpan { span: None }
    }

    pub(super) fn new(span: Span) -> ResultSpan {
        ResultSpan {
            span: Some(Box::new(span)),
        }
    }

    /// The worker's span context, when it has one (sampled or not).
    pub fn context(&self) -> Option<&SpanContext> {
        self.span.as_ref().map(|s| s.span_context())
    }

    /// Whether this span is recorded and exported.
    pub fn is_sampled(&self) -> bool {
        self.span.as_ref().is_some_and(|s| s.is_recording())
    }

    fn recording(&mut self) -> Option<&mut Span> {
        self.span.as_deref_mut().filter(|s| s.is_recording())
    }

    /// Makes the output's `traceparent` name this span as its parent (a
    /// new root gets one too, so the next hop joins the trace). Without
    /// tracing the headers stay as the input had them.
    pub fn propagate(&self, trace: &mut TraceHeaders) {
        if let Some(context) = self.context() {
            context::set_traceparent(trace, context::traceparent(context));
        }
    }

    /// A `tracing` span carrying `trace_id` and `span_id`, to run the
    /// result's work in (`Instrument`), so its log lines name the trace.
    /// Disabled when the span is not exported: an ID no collector holds
    /// leads nowhere, and unsampled results then cost no log span.
    pub fn log_span(&self) -> tracing::Span {
        match self.context().filter(|c| c.is_sampled()) {
            Some(c) => tracing::info_span!(
                "result",
                trace_id = %c.trace_id(),
                span_id = %c.span_id()
            ),
            None => tracing::Span::none(),
        }
    }

    /// The decision is made: its outcome, and the request it was for.
    pub fn decided(&mut self, decision: &Decision) {
        let Some(span) = self.recording() else {
            return;
        };
        if let Some(id) = &decision.request_id {
            span.set_attribute(KeyValue::new(attr::REQUEST_ID, id.clone()));
        }
        span.add_event("decided", outcome_attributes(&decision.outcome));
    }

    /// The output is out (confirmed, in durable mode): the final outcome
    /// (a dead letter when the output could not go out), where it went and
    /// its size.
    pub fn published(&mut self, outcome: &Outcome, subject: &str, size: usize) {
        let Some(span) = self.recording() else {
            return;
        };
        span.set_attributes(outcome_attributes(outcome));
        span.set_attribute(KeyValue::new(attr::OUTPUT_SUBJECT, subject.to_string()));
        span.set_attribute(KeyValue::new(attr::OUTPUT_SIZE, size as i64));
        if let Outcome::Error { code } = outcome {
            span.set_status(Status::error(code.as_str()));
        } else if let Outcome::DeadLetter { code } = outcome {
            span.set_status(Status::error(code.as_str()));
        }
        span.add_event("published", Vec::new());
    }

    /// No output went out (the publish failed, or it waits for redelivery).
    pub fn not_published(&mut self, outcome: &Outcome, why: &str) {
        let Some(span) = self.recording() else {
            return;
        };
        span.set_attributes(outcome_attributes(outcome));
        span.set_status(Status::error(why.to_string()));
    }

    /// Settled with the transport: `ack`, `term`, `nak` (core mode has
    /// nothing to settle and says `none`).
    pub fn settled(&mut self, how: &'static str) {
        let Some(span) = self.recording() else {
            return;
        };
        span.set_attribute(KeyValue::new(attr::SETTLE, how));
        span.add_event("settled", Vec::new());
    }

    /// Ends the span now (dropping it does the same).
    pub fn end(mut self) {
        if let Some(span) = self.span.as_deref_mut() {
            span.end();
        }
    }
}

/// The outcome as attributes: its kind and the backend, finish reason or
/// code that goes with it.
fn outcome_attributes(outcome: &Outcome) -> Vec<KeyValue> {
    let kind = KeyValue::new(attr::OUTCOME, outcome.kind());
    match outcome {
        Outcome::Decode { backend, minted } => vec![
            kind,
            KeyValue::new(attr::BACKEND, backend.as_str()),
            KeyValue::new(attr::MINTED, *minted),
        ],
        Outcome::Terminal { finish_reason } => {
            vec![
                kind,
                KeyValue::new(attr::FINISH_REASON, finish_reason.as_str()),
            ]
        }
        Outcome::Error { code } => vec![kind, KeyValue::new(attr::ERROR_CODE, code.as_str())],
        Outcome::DeadLetter { code } => {
            vec![kind, KeyValue::new(attr::DEAD_LETTER_CODE, code.as_str())]
        }
    }
}

/// The attributes a result's span starts with.
pub(super) fn start_attributes(arrival: &Arrival<'_>, machine_id: Option<u16>) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new(attr::MESSAGING_SYSTEM, "nats"),
        KeyValue::new(attr::MESSAGING_OPERATION_TYPE, "process"),
        KeyValue::new(attr::MESSAGING_DESTINATION, arrival.subject.to_string()),
        KeyValue::new(attr::MESSAGING_BODY_SIZE, arrival.size as i64),
        KeyValue::new(attr::DELIVERY_ATTEMPT, arrival.attempt),
    ];
    if let Some(id) = machine_id {
        attributes.push(KeyValue::new(attr::MACHINE_ID, i64::from(id)));
    }
    attributes
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// Without tracing nothing is built: no span, no log span, the output's
    /// trace headers exactly the input's.
    #[test]
    fn without_tracing_a_result_span_holds_nothing_and_changes_nothing() {
        let span = ResultSpan::none();
        assert!(span.context().is_none());
        assert!(!span.is_sampled());
        assert!(span.log_span().is_disabled());
        let mut trace = TraceHeaders::from_pairs([("traceparent", TP), ("tracestate", "a=1")]);
        let before = trace.clone();
        span.propagate(&mut trace);
        assert_eq!(trace, before);
        let mut root = TraceHeaders::from_pairs([]);
        span.propagate(&mut root);
        assert!(root.is_empty(), "no traceparent is invented for a root");
        assert_eq!(
            std::mem::size_of::<ResultSpan>(),
            std::mem::size_of::<usize>()
        );
    }
}
