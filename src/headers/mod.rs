//! NATS headers, in and out: the one module that knows how a message's
//! headers are named, read and written, for every output of both delivery
//! modes, the ID service's answers and the cancel intake.
//!
//! - Reading: [`first`] finds a header without regard to the case of its
//!   name, as HTTP and most NATS clients do; [`block_error`] recognizes the
//!   client's marker on a message whose header block it could not parse;
//!   [`TraceHeaders::read`] takes the W3C trace headers an input passes on.
//! - Writing: [`Headers`] is what an output sets (a constant name and a value
//!   that can stand in a header line each), and [`outgoing`] is the client's
//!   map of it plus the copied trace headers. The client frames the block.
//! - [`names`]: every header the worker reads or writes, named once.
//!
//! Imports nothing of the crate: the decision, the pipeline and the ID
//! service sit above it.

mod msg_id;
pub mod names;
mod set;
mod trace;

pub use msg_id::{msg_id, release_msg_id};
pub use set::Headers;
pub use trace::{
    MAX_TRACESTATE_BYTES, MAX_TRACESTATE_MEMBERS, TRACEPARENT_LEN, TraceHeader, TraceHeaders,
};

use async_nats::header::HEADER_BLOCK_ERROR;
use async_nats::{HeaderMap, HeaderName, HeaderValue};

/// The first value of the header `name`, matched without regard to case.
/// Every read of a received message's headers goes through here or
/// [`block_error`] (the transport, which imports nothing of the crate, reads
/// only the `Nats-Msg-Id` of decode jobs the worker stored itself).
pub fn first<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?
        .iter()
        .find(|(n, _)| AsRef::<str>::as_ref(n).eq_ignore_ascii_case(name))
        .and_then(|(_, values)| values.first())
        .map(|v| v.as_str())
}

/// What was wrong with the message's NATS header block, when the client could
/// not parse it; `None` for a well-formed block or none at all. Its headers
/// are then unknown (content type, trace context): only the marker is there.
///
/// The vendored client (docs/vendor-async-nats.md) delivers such a message
/// with one header only, [`HEADER_BLOCK_ERROR`], saying what was wrong. It
/// sets the marker under exactly that name and never takes it from the wire
/// (a block naming it, in any case, is itself unparsable), so it is looked up
/// exactly, and a publisher forging it only gets its own message refused.
///
/// Found by walking the map, as [`first`] does: `HeaderMap::get` builds,
/// allocates and hashes a name per call, where a result carries one to
/// three headers.
pub fn block_error(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?
        .iter()
        .find(|(name, _)| AsRef::<str>::as_ref(*name) == HEADER_BLOCK_ERROR)
        .and_then(|(_, values)| values.first())
        .map(|what| what.as_str())
}

/// An output's headers for the client: `set` (the output's own), then the
/// copied trace headers. Empty when both are (the sink then publishes
/// without headers).
pub fn outgoing(set: Headers, trace: &TraceHeaders) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in set.into_fields() {
        append(&mut map, name, value);
    }
    for (name, value) in &trace.copy {
        append(&mut map, name, value.clone());
    }
    map
}

/// Appends one header. `name` is one of [`names`]' constants, and `value`
/// holds no line break ([`Headers::push`] replaced them; a copied trace
/// header is printable ASCII), so the client takes the value's bytes as
/// they are.
fn append(map: &mut HeaderMap, name: &'static str, value: String) {
    let value = match HeaderValue::try_from(value) {
        Ok(value) => value,
        Err(_) => {
            debug_assert!(false, "a line break in the value of {name}");
            return;
        }
    };
    map.append(HeaderName::from_static(name), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn pairs(map: &HeaderMap) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = map
            .iter()
            .flat_map(|(name, values)| {
                let name: &str = name.as_ref();
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_string()))
            })
            .collect();
        out.sort();
        out
    }

    fn input() -> HeaderMap {
        let mut input = HeaderMap::new();
        input.insert("TraceParent", TP);
        input.insert("tracestate", "k=v");
        input.insert("Content-Type", "application/json");
        input.insert("Nats-Msg-Id", "from-the-producer");
        input
    }

    #[test]
    fn outputs_carry_their_own_headers_and_the_trace_headers_under_canonical_names() {
        let input = input();
        let trace = TraceHeaders::read(Some(&input));
        let map = outgoing(Headers::msg_id("r1"), &trace);
        let want = [
            ("Nats-Msg-Id", "handoff-r1"),
            ("traceparent", TP),
            ("tracestate", "k=v"),
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()));
        assert_eq!(pairs(&map), want);
        let none = TraceHeaders::read(None);
        assert_eq!(
            pairs(&outgoing(Headers::msg_id("r1"), &none)),
            want[..1].to_vec()
        );
        assert!(outgoing(Headers::new(), &none).is_empty());
        assert_eq!(pairs(&outgoing(Headers::new(), &trace)), want[1..].to_vec());
    }

    #[test]
    fn a_line_break_in_a_value_becomes_a_space() {
        let mut set = Headers::new();
        set.push("Handoff-Detail", "one\r\ntwo\n");
        set.push("Handoff-Other", "lone\rcr");
        let map = outgoing(set, &TraceHeaders::default());
        assert_eq!(
            pairs(&map),
            [
                ("Handoff-Detail", "one  two "),
                ("Handoff-Other", "lone cr")
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
    }

    #[test]
    fn incoming_headers_are_read_without_regard_to_case_but_the_marker_exactly() {
        let input = input();
        assert_eq!(
            first(Some(&input), "content-type"),
            Some("application/json")
        );
        assert_eq!(first(Some(&input), "TRACESTATE"), Some("k=v"));
        assert_eq!(first(Some(&input), "Handoff-Deadline"), None);
        assert_eq!(first(None, "content-type"), None);
        assert_eq!(block_error(Some(&input)), None);
        let mut marked = HeaderMap::new();
        marked.insert(HEADER_BLOCK_ERROR, "a line without a colon");
        assert_eq!(block_error(Some(&marked)), Some("a line without a colon"));
        let mut other_case = HeaderMap::new();
        other_case.insert(HEADER_BLOCK_ERROR.to_ascii_lowercase().as_str(), "forged");
        assert_eq!(block_error(Some(&other_case)), None);
        assert_eq!(block_error(None), None);
    }
}
