//! W3C `traceparent` to OpenTelemetry's span context and back.
//!
//! The input's headers are checked once, by [`TraceHeaders::read`]
//! (the rule that decides what outputs carry); this reads what that rule
//! let through, so a header it dropped is never a parent either.

use crate::headers::TraceHeaders;
use crate::headers::names::{TRACEPARENT, TRACESTATE};
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use std::str::FromStr;

/// The remote parent named by the input's copied `traceparent` (and its
/// `tracestate`), or `None`: the result starts a new trace.
pub fn remote_parent(trace: &TraceHeaders) -> Option<SpanContext> {
    let value = header(trace, TRACEPARENT)?;
    // `00-{32 hex}-{16 hex}-{2 hex}`, checked by TraceHeaders::read.
    let trace_id = TraceId::from_hex(value.get(3..35)?).ok()?;
    let span_id = SpanId::from_hex(value.get(36..52)?).ok()?;
    let flags = u8::from_str_radix(value.get(53..55)?, 16).ok()?;
    let state = header(trace, TRACESTATE)
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let context = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
    context.is_valid().then_some(context)
}

/// The `traceparent` naming `context` as the parent: what the worker's
/// outputs carry, so the next hop's span hangs under the worker's.
pub fn traceparent(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

/// Replaces (or adds, for a new trace) the output's `traceparent` with the
/// worker's own; a copied `tracestate` stays as it came.
pub fn set_traceparent(trace: &mut TraceHeaders, value: String) {
    match trace.copy.iter_mut().find(|(name, _)| *name == TRACEPARENT) {
        Some((_, old)) => *old = value,
        // traceparent goes first: a tracestate belongs to it (W3C 3.3.1).
        None => trace.copy.insert(0, (TRACEPARENT, value)),
    }
}

fn header<'a>(trace: &'a TraceHeaders, name: &str) -> Option<&'a str> {
    trace
        .copy
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_copied_traceparent_is_the_remote_parent() {
        let trace = TraceHeaders::from_pairs([("traceparent", TP), ("tracestate", "rojo=1")]);
        let parent = remote_parent(&trace).unwrap();
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled());
        assert!(parent.is_remote());
        assert_eq!(parent.trace_state().header(), "rojo=1");
        assert_eq!(traceparent(&parent), TP);
    }

    #[test]
    fn the_sampled_flag_is_kept_as_it_came() {
        let unsampled = TP.replace("-01", "-00");
        let trace = TraceHeaders::from_pairs([("traceparent", unsampled.as_str())]);
        let parent = remote_parent(&trace).unwrap();
        assert!(!parent.is_sampled());
        assert_eq!(traceparent(&parent), unsampled);
    }

    #[test]
    fn no_parent_without_a_copied_traceparent() {
        assert!(remote_parent(&TraceHeaders::from_pairs([])).is_none());
        // Dropped by the header rule (upper-case hex), so no parent either.
        let upper = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        assert!(remote_parent(&TraceHeaders::from_pairs([("traceparent", upper)])).is_none());
    }

    #[test]
    fn the_outgoing_traceparent_replaces_or_leads() {
        let mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01".to_string();
        let mut trace = TraceHeaders::from_pairs([("traceparent", TP), ("tracestate", "a=1")]);
        set_traceparent(&mut trace, mine.clone());
        assert_eq!(
            trace.copy,
            vec![(TRACEPARENT, mine.clone()), (TRACESTATE, "a=1".to_string())]
        );
        let mut root = TraceHeaders::from_pairs([]);
        set_traceparent(&mut root, mine.clone());
        assert_eq!(root.copy, vec![(TRACEPARENT, mine)]);
    }
}
