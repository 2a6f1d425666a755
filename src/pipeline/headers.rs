//! The one header policy, for every output of both delivery modes and the
//! ID service's answers: the decision's own headers, plus the input's trace
//! headers that passed [`decision::trace_headers`] (W3C-validated, under
//! their canonical lowercase names, one value each).
//!
//! Before this, core mode kept the input's spelling of a trace header and
//! copied every value, while durable mode wrote the lowercase names and
//! copied one.

use crate::decision::{self, TraceHeaders};
use async_nats::HeaderMap;
use bytes::Bytes;

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
/// Built for every output, so built as the bytes that go on the wire
/// ([`header_block`], handed to the client as they are): a map of the
/// headers (a hash map, a vector and a string per header) cost about 8% of
/// the worker's CPU in bursts, built, measured and serialized again by the
/// client for each publish. Its headers are therefore not visible through
/// [`HeaderMap::get`]; read them from `set` and `trace`.
pub fn output_headers(set: &[(&'static str, String)], trace: &TraceHeaders) -> HeaderMap {
    match header_block(set, trace) {
        Some(block) => HeaderMap::from_wire(Bytes::from(block)),
        None => HeaderMap::new(),
    }
}

/// The NATS header block of `set` then `trace.copy`: `NATS/1.0`, a
/// `Name: value` line each, a blank line, every line ending in CRLF; `None`
/// when there is no header. Names are constants of the decision or of the
/// trace policy; a line break in a value (which cannot stand in a header)
/// becomes a space.
pub fn header_block(set: &[(&'static str, String)], trace: &TraceHeaders) -> Option<Vec<u8>> {
    if set.is_empty() && trace.copy.is_empty() {
        return None;
    }
    let lines = set.iter().chain(&trace.copy);
    let size = lines
        .clone()
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum::<usize>();
    let mut block = Vec::with_capacity(HEAD.len() + size + 2);
    block.extend_from_slice(HEAD);
    for (name, value) in lines {
        block.extend_from_slice(name.as_bytes());
        block.extend_from_slice(b": ");
        let start = block.len();
        block.extend_from_slice(value.as_bytes());
        // Looked for first, and rewritten from the first one on: rewriting
        // every value a byte at a time cost about 100 instructions per
        // output, for values that never hold one.
        if let Some(first) = memchr::memchr2(b'\r', b'\n', value.as_bytes()) {
            for b in &mut block[start + first..] {
                if matches!(*b, b'\r' | b'\n') {
                    *b = b' ';
                }
            }
        }
        block.extend_from_slice(b"\r\n");
    }
    block.extend_from_slice(b"\r\n");
    Some(block)
}

const HEAD: &[u8] = b"NATS/1.0\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(block: &[u8]) -> Vec<String> {
        let text = std::str::from_utf8(block).unwrap();
        assert!(text.starts_with("NATS/1.0\r\n") && text.ends_with("\r\n\r\n"));
        text["NATS/1.0\r\n".len()..text.len() - 4]
            .split("\r\n")
            .map(str::to_string)
            .collect()
    }

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
        let block = header_block(&set, &trace).unwrap();
        let mut got = lines(&block);
        got[1..].sort();
        assert_eq!(
            got,
            vec![
                "Nats-Msg-Id: handoff-r1",
                "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "tracestate: k=v",
            ],
            "the decision's own first, then the trace headers"
        );
        assert!(!output_headers(&set, &trace).is_empty());
        let none = trace_headers(None);
        assert_eq!(
            header_block(&set, &none).unwrap(),
            b"NATS/1.0\r\nNats-Msg-Id: handoff-r1\r\n\r\n".to_vec()
        );
        assert_eq!(header_block(&[], &none), None);
        assert!(output_headers(&[], &none).is_empty());
    }

    #[test]
    fn a_line_break_in_a_value_becomes_a_space() {
        let set = [("Handoff-Detail", "one\r\ntwo\n".to_string())];
        let block = header_block(&set, &TraceHeaders::default()).unwrap();
        assert_eq!(lines(&block), vec!["Handoff-Detail: one  two "]);
    }
}
