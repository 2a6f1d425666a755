//! The values of `Nats-Msg-Id`: a decode job's and a KV release notice's,
//! from the request ID, escaped so that distinct request IDs keep distinct
//! message IDs.

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

const MSG_ID_PREFIX: &str = "handoff-";
const RELEASE_PREFIX: &str = "release-";

/// What is percent-encoded besides non-ASCII bytes (which `percent-encoding`
/// always encodes): control characters and DEL, which cannot stand in a
/// header; the space, which a client might trim; and `%` itself, so that a
/// request ID `a%20b` cannot take the message ID of `a b`.
const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%');

/// The `Nats-Msg-Id` of a decode job: `handoff-{request_id}`, with bytes that
/// cannot stand in a header (control characters, `%`, non-ASCII) or that a
/// client might trim (spaces) percent-encoded, so that distinct request IDs
/// keep distinct message IDs.
pub fn msg_id(request_id: &str) -> String {
    prefixed_msg_id(MSG_ID_PREFIX, request_id)
}

/// The `Nats-Msg-Id` of a KV release notice: `release-{request_id}`,
/// escaped as [`msg_id`] escapes it.
pub fn release_msg_id(request_id: &str) -> String {
    prefixed_msg_id(RELEASE_PREFIX, request_id)
}

/// `prefix` then the escaped request ID, in a string of exactly its size
/// when nothing needs escaping (the usual case: `chatcmpl-` and a UUID).
fn prefixed_msg_id(prefix: &str, request_id: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + request_id.len());
    out.push_str(prefix);
    // Pieces of the request ID as it is, and `%XX` for each escaped byte.
    for piece in utf8_percent_encode(request_id, ESCAPED) {
        out.push_str(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_msg_id_escapes_what_cannot_stand_in_a_header_and_fits_its_string() {
        assert_eq!(msg_id("a b%c\u{e9}"), "handoff-a%20b%25c%C3%A9");
        assert_eq!(release_msg_id("a b"), "release-a%20b");
        let id = msg_id("chatcmpl-0123456789");
        assert_eq!(id.capacity(), id.len(), "exactly sized");
        assert!(msg_id("x\r\n\u{0}").is_ascii());
        assert_eq!(msg_id("x\r\n\u{0}\u{7f}"), "handoff-x%0D%0A%00%7F");
    }

    #[test]
    fn every_byte_is_escaped_or_kept_whatever_the_length_and_the_position() {
        let plain: String = (b'!'..0x7f)
            .filter(|&b| b != b'%')
            .map(char::from)
            .collect();
        assert_eq!(msg_id(&plain), format!("handoff-{plain}"));
        for len in 0..=50 {
            let id = "a".repeat(len);
            assert_eq!(msg_id(&id), format!("handoff-{id}"), "{len} plain bytes");
            for at in 0..len {
                for (bad, escaped) in [
                    (" ", "%20"),
                    ("%", "%25"),
                    ("\n", "%0A"),
                    ("\u{7f}", "%7F"),
                    ("\u{0}", "%00"),
                    ("\u{80}", "%C2%80"),
                    ("\u{ff}", "%C3%BF"),
                ] {
                    let mut id = id.clone();
                    id.replace_range(at..=at, bad);
                    let expected = format!("{}{escaped}{}", &id[..at], &id[at + bad.len()..]);
                    assert_eq!(
                        msg_id(&id),
                        format!("handoff-{expected}"),
                        "{len} bytes, {bad:?} at {at}"
                    );
                }
            }
        }
    }
}
