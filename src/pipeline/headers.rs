//! The one header policy, for every output of both delivery modes and the
//! ID service's answers: the decision's own headers, plus the input's trace
//! headers that passed [`decision::trace_headers`] (W3C-validated, under
//! their canonical lowercase names, one value each).
//!
//! Before this, core mode kept the input's spelling of a trace header and
//! copied every value, while durable mode wrote the lowercase names and
//! copied one.

use crate::decision::{self, HEADER_BLOCK_HEAD as HEAD, Headers, TraceHeaders};
use async_nats::{HeaderMap, HeaderName};

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
pub fn output_headers(set: &Headers, trace: &TraceHeaders) -> HeaderMap {
    wire(header_block(set, trace))
}

/// [`output_headers`] for a decision's own headers, finished where they
/// are: a decode job's block has room for the rest ([`Headers::msg_id`]),
/// so the common output moves no header byte again.
pub fn finish_headers(set: Headers, trace: &TraceHeaders) -> HeaderMap {
    wire(finish_block(set, trace))
}

/// [`header_block`], from a block the caller no longer needs.
fn finish_block(set: Headers, trace: &TraceHeaders) -> Option<Vec<u8>> {
    if set.is_empty() {
        return header_block(&set, trace);
    }
    let mut block = set.into_bytes();
    close(&mut block, trace);
    Some(block)
}

/// The client's map of a block built here: `NATS/1.0`, then `Name: value`
/// lines whose names are the decision's or the trace policy's constants and
/// whose values hold no line break, then a blank line.
///
/// Read a byte at a time, not through `str` pattern searches, which set up
/// a searcher per line that costs more than the short line itself
/// (`docs/performance.md`). The first name goes in without a look-up.
fn wire(block: Option<Vec<u8>>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let Some(block) = block else {
        return headers;
    };
    // Built from `&str`s split only at ASCII bytes: always UTF-8.
    let Ok(text) = std::str::from_utf8(block.strip_prefix(HEAD).unwrap_or(&block)) else {
        return headers;
    };
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.bytes().position(|b| b == b'\n').unwrap_or(rest.len());
        let line = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or_default();
        let line = line.strip_suffix('\r').unwrap_or(line);
        let Some(colon) = line.bytes().position(|b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(' ').unwrap_or(value);
        let Some(name) = header_name(name) else {
            continue;
        };
        if headers.is_empty() {
            headers.insert(name, value);
        } else {
            headers.append(name, value);
        }
    }
    headers
}

/// The client's name for `name`; the decode job's `Nats-Msg-Id` without
/// parsing it again. Never `None` for the constants the block is built of.
fn header_name(name: &str) -> Option<HeaderName> {
    if name == "Nats-Msg-Id" {
        return Some(async_nats::header::NATS_MESSAGE_ID);
    }
    name.parse().ok()
}

/// The NATS header block of `set` then `trace.copy`: `NATS/1.0`, a
/// `Name: value` line each, a blank line, every line ending in CRLF; `None`
/// when there is no header. Names are constants of the decision or of the
/// trace policy; a line break in a value (which cannot stand in a header)
/// becomes a space ([`Headers::push`]).
pub fn header_block(set: &Headers, trace: &TraceHeaders) -> Option<Vec<u8>> {
    if set.is_empty() && trace.copy.is_empty() {
        return None;
    }
    let size = trace
        .copy
        .iter()
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum::<usize>();
    let mut block = Vec::with_capacity(HEAD.len() + set.as_bytes().len() + size + 2);
    if set.is_empty() {
        block.extend_from_slice(HEAD);
    } else {
        block.extend_from_slice(set.as_bytes());
    }
    close(&mut block, trace);
    Some(block)
}

/// Appends the trace headers' lines and the closing blank line to a block
/// that holds `NATS/1.0` and any lines before them.
fn close(block: &mut Vec<u8>, trace: &TraceHeaders) {
    for (name, value) in &trace.copy {
        decision::push_line(block, name, value);
    }
    block.extend_from_slice(b"\r\n");
}

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
        let set = Headers::msg_id("r1");
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
        assert_eq!(header_block(&Headers::new(), &none), None);
        assert!(output_headers(&Headers::new(), &none).is_empty());
        // A decision's own block, finished in place, is the same block.
        for set in [set, Headers::new()] {
            for t in [&trace, &none] {
                assert_eq!(finish_block(set.clone(), t), header_block(&set, t));
            }
        }
        assert!(finish_headers(Headers::new(), &none).is_empty());
    }

    #[test]
    fn the_clients_map_holds_every_line_of_the_block_once() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut input = HeaderMap::new();
        input.insert("traceparent", tp);
        input.insert("tracestate", "k=v: w");
        let trace = trace_headers(Some(&input));
        let mut set = Headers::job("r1", Some(1_700_000_000_123));
        set.push("Handoff-Detail", "a: b");
        let map = finish_headers(set, &trace);
        let get = |name: &str| map.get_all(name).map(|v| v.as_str()).collect::<Vec<_>>();
        assert_eq!(map.len(), 5, "{map:?}");
        assert_eq!(get("Nats-Msg-Id"), ["handoff-r1"]);
        assert_eq!(get("Handoff-Deadline"), ["1700000000123"]);
        assert_eq!(get("Handoff-Detail"), ["a: b"]);
        assert_eq!(get("traceparent"), [tp]);
        assert_eq!(get("tracestate"), ["k=v: w"]);
    }

    #[test]
    fn a_line_break_in_a_value_becomes_a_space() {
        let mut set = Headers::new();
        set.push("Handoff-Detail", "one\r\ntwo\n");
        let block = header_block(&set, &TraceHeaders::default()).unwrap();
        assert_eq!(lines(&block), vec!["Handoff-Detail: one  two "]);
    }
}
