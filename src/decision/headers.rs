//! Header values the decision sets. NATS header values cannot hold CR or LF
//! (async-nats panics on them), so nothing taken from the input reaches a
//! header unescaped.

use super::DeadLetterCode;
use crate::wire::Encoding;

/// The `Nats-Msg-Id` of a decode job: `handoff-{request_id}`, with bytes that
/// cannot stand in a header (control characters, `%`, non-ASCII) or that a
/// client might trim (spaces) percent-encoded, so that distinct request IDs
/// keep distinct message IDs.
pub fn msg_id(request_id: &str) -> String {
    let mut out = String::with_capacity(8 + request_id.len());
    out.push_str("handoff-");
    let plain = |b: u8| (b'!'..0x7f).contains(&b) && b != b'%';
    // A branch-free pass (vectorized) for the common all-plain ID.
    if request_id.bytes().fold(true, |all, b| all & plain(b)) {
        out.push_str(request_id);
        return out;
    }
    for b in request_id.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

/// The headers every dead letter carries: its code, a sentence saying why,
/// and the subject the input came from, with control characters replaced
/// and the sentence's length bounded ([`header_safe`]).
pub fn dead_letter_headers(
    code: DeadLetterCode,
    why: &str,
    source_subject: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("Handoff-Error-Code", code.as_str().to_string()),
        ("Handoff-Error", header_safe(why)),
        ("Handoff-Source-Subject", header_safe(source_subject)),
    ]
}

/// Header of a dead letter sent without the input's bytes, because even the
/// input alone does not fit the server's `max_payload` once the dead letter's
/// headers are added: how many bytes the input had.
pub const PAYLOAD_OMITTED: &str = "Handoff-Payload-Omitted";

/// A dead letter's headers for when the input's bytes cannot go with it: the
/// same headers plus [`PAYLOAD_OMITTED`] with the input's size.
pub fn without_payload(
    set: &[(&'static str, String)],
    bytes: usize,
) -> Vec<(&'static str, String)> {
    let mut set = set.to_vec();
    set.push((PAYLOAD_OMITTED, bytes.to_string()));
    set
}

/// A header value with control characters replaced by spaces and the length
/// bounded, so that no input can inject a header line.
pub(super) fn header_safe(s: &str) -> String {
    truncate(s, 1024)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `Content-Type: application/json` for JSON outputs, nothing for MessagePack.
pub(super) fn content_type(encoding: Encoding) -> Vec<(&'static str, String)> {
    encoding
        .content_type()
        .map(|ct| vec![("Content-Type", ct.to_string())])
        .unwrap_or_default()
}

/// At most `max` bytes of `s` (cut at a character boundary), with an ellipsis
/// when something was cut.
pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
