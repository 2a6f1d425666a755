//! The headers the decision sets besides a decode job's ([`Headers::job`]):
//! a dead letter's, and the content type of a JSON output. Nothing taken
//! from the input reaches a header unbounded or with a control character.

use super::DeadLetterCode;
use crate::headers::Headers;
use crate::headers::names::{
    CONTENT_TYPE, HANDOFF_ERROR, HANDOFF_ERROR_CODE, HANDOFF_PAYLOAD_OMITTED,
    HANDOFF_SOURCE_SUBJECT,
};
use crate::wire::Encoding;

/// The headers every dead letter carries: its code, a sentence saying why,
/// and the subject the input came from, with control characters replaced
/// and the sentence's length bounded ([`header_safe`]).
pub fn dead_letter_headers(code: DeadLetterCode, why: &str, source_subject: &str) -> Headers {
    let mut headers = Headers::new();
    headers.push(HANDOFF_ERROR_CODE, code.as_str());
    headers.push(HANDOFF_ERROR, &header_safe(why));
    headers.push(HANDOFF_SOURCE_SUBJECT, &header_safe(source_subject));
    headers
}

/// A dead letter's headers for when the input's bytes cannot go with it: the
/// same headers plus `Handoff-Payload-Omitted` with the input's size.
pub fn without_payload(set: &Headers, bytes: usize) -> Headers {
    let mut set = set.clone();
    set.push(HANDOFF_PAYLOAD_OMITTED, &bytes.to_string());
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
pub fn content_type(encoding: Encoding) -> Headers {
    let mut headers = Headers::new();
    push_content_type(&mut headers, encoding);
    headers
}

/// Appends [`content_type`]'s header, if any, to `headers`.
pub(super) fn push_content_type(headers: &mut Headers, encoding: Encoding) {
    if let Some(ct) = encoding.content_type() {
        headers.push(CONTENT_TYPE, ct);
    }
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
