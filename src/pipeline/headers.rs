//! The one header policy, for every output of both delivery modes and the
//! ID service's answers: the decision's own headers, plus the input's trace
//! headers that passed [`decision::trace_headers`] (W3C-validated, under
//! their canonical lowercase names, one value each).
//!
//! Before this, core mode kept the input's spelling of a trace header and
//! copied every value, while durable mode wrote the lowercase names and
//! copied one.

use crate::decision::{self, TraceHeaders};
use async_nats::{HeaderMap, HeaderName, HeaderValue};

/// The trace headers an input passes on to its outputs.
pub fn trace_headers(headers: Option<&HeaderMap>) -> TraceHeaders {
    let Some(headers) = headers else {
        return TraceHeaders::default();
    };
    decision::trace_headers(headers.iter().flat_map(|(name, values)| {
        let name: &str = name.as_ref();
        values.iter().map(move |value| (name, value.as_str()))
    }))
}

/// An output's headers: `set` (the decision's), then the copied trace
/// headers. Empty when both are (the sink then publishes without headers).
///
/// Built for every output, so built cheaply: the names are static and
/// become [`HeaderName::from_static`] (no allocation, no validation: every
/// name here is a constant of the decision or of the trace policy), and each
/// value is copied once (`parse` validated and copied it, and `insert` by
/// `&str` copied the name again).
pub fn output_headers(set: &[(&'static str, String)], trace: &TraceHeaders) -> HeaderMap {
    set.iter()
        .chain(&trace.copy)
        .map(|(name, value)| (HeaderName::from_static(name), header_value(value)))
        .collect()
}

/// A header value; line breaks (which cannot stand in a header) become spaces.
fn header_value(value: &str) -> HeaderValue {
    if value.contains(['\r', '\n']) {
        HeaderValue::from(value.replace(['\r', '\n'], " "))
    } else {
        HeaderValue::from(value.to_owned())
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
        let trace = trace_headers(Some(&input));
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
        let none = trace_headers(None);
        assert_eq!(output_headers(&set, &none).iter().count(), 1);
        assert!(output_headers(&[], &none).is_empty());
    }

    #[test]
    fn a_line_break_in_a_value_becomes_a_space() {
        let set = [("Handoff-Detail", "one\r\ntwo".to_string())];
        let out = output_headers(&set, &TraceHeaders::default());
        assert_eq!(
            out.get("Handoff-Detail").map(|v| v.as_str()),
            Some("one  two")
        );
    }
}
