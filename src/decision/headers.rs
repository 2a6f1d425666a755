//! Header values the decision sets. NATS header values cannot hold CR or LF
//! (async-nats panics on them), so nothing taken from the input reaches a
//! header unescaped.

use super::DeadLetterCode;
use crate::wire::Encoding;

/// The headers a decision sets, held as the NATS header block they go out
/// as: `NATS/1.0` and a `Name: value` line each, every line ending in CRLF,
/// without the blank line that closes a block (the pipeline adds the
/// input's trace headers first: `pipeline::headers`). Empty when there is
/// no header.
///
/// Every decode job carries one header, `Nats-Msg-Id`. As a list of
/// `(name, String)` pairs it would take three allocations per job (the
/// value, the list, then the block built from them for the client); written
/// here as the block, it takes one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    block: Vec<u8>,
}

/// The first line of every NATS header block.
pub const HEAD: &[u8] = b"NATS/1.0\r\n";

impl Headers {
    pub const fn new() -> Headers {
        Headers { block: Vec::new() }
    }

    /// A decode job's one header, `Nats-Msg-Id` ([`msg_id`]), with room
    /// for exactly the closing CRLF. The block then fills its allocation
    /// once the pipeline closes it, and `Bytes` takes it over as it is: for
    /// a buffer with room to spare it allocates a record of the capacity,
    /// as dear as the copy saved. A trace header grows the block once.
    pub fn msg_id(request_id: &str) -> Headers {
        const NAME: &[u8] = b"Nats-Msg-Id: ";
        // Exact for a request ID of plain bytes (the rest grows it once).
        let mut block = Vec::with_capacity(
            HEAD.len() + NAME.len() + MSG_ID_PREFIX.len() + request_id.len() + 2 + 2,
        );
        block.extend_from_slice(HEAD);
        block.extend_from_slice(NAME);
        push_msg_id(&mut block, request_id);
        block.extend_from_slice(b"\r\n");
        Headers { block }
    }

    /// Appends `name: value`. `name` is a constant (no `:`, space or line
    /// break); a CR or LF in `value`, which cannot stand in a header line,
    /// becomes a space.
    pub fn push(&mut self, name: &str, value: &str) {
        debug_assert!(!name.is_empty() && !name.contains([':', ' ', '\r', '\n']));
        if self.block.is_empty() {
            self.block.extend_from_slice(HEAD);
        }
        push_line(&mut self.block, name, value);
    }

    pub fn is_empty(&self) -> bool {
        self.block.is_empty()
    }

    /// The value of the first header named `name` (exactly).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// `(name, value)` in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        // Built only by `push` and `msg_id`, from `&str`s with ASCII CR and
        // LF replaced: UTF-8, and split only at the CRLFs they wrote.
        let text = std::str::from_utf8(self.block.get(HEAD.len()..).unwrap_or_default())
            .unwrap_or_default();
        text.split_terminator("\r\n")
            .filter_map(|line| line.split_once(": "))
    }

    /// The block so far (`NATS/1.0` and the lines; empty for no header).
    pub fn as_bytes(&self) -> &[u8] {
        &self.block
    }

    /// The block so far, to be finished by the caller.
    pub fn into_bytes(self) -> Vec<u8> {
        self.block
    }
}

/// Appends the header line `name: value` to a block, a CR or LF in `value`
/// written as a space ([`Headers::push`]).
pub fn push_line(block: &mut Vec<u8>, name: &str, value: &str) {
    block.extend_from_slice(name.as_bytes());
    block.extend_from_slice(b": ");
    let start = block.len();
    block.extend_from_slice(value.as_bytes());
    // Looked for first, and rewritten from the first one on: values almost
    // never hold one, and rewriting every value a byte at a time would
    // cost every output a pass it does not need.
    if let Some(first) = memchr::memchr2(b'\r', b'\n', value.as_bytes()) {
        for b in &mut block[start + first..] {
            if matches!(*b, b'\r' | b'\n') {
                *b = b' ';
            }
        }
    }
    block.extend_from_slice(b"\r\n");
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a str, &'a str);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a str)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

const MSG_ID_PREFIX: &[u8] = b"handoff-";

/// The `Nats-Msg-Id` of a decode job: `handoff-{request_id}`, with bytes that
/// cannot stand in a header (control characters, `%`, non-ASCII) or that a
/// client might trim (spaces) percent-encoded, so that distinct request IDs
/// keep distinct message IDs.
pub fn msg_id(request_id: &str) -> String {
    let mut out = Vec::with_capacity(MSG_ID_PREFIX.len() + request_id.len());
    push_msg_id(&mut out, request_id);
    // Plain bytes are printable ASCII and the rest is written as `%XX`.
    String::from_utf8(out).unwrap_or_default()
}

/// A byte written as it is in a message ID: printable ASCII but `%`.
fn plain(b: u8) -> bool {
    (b'!'..0x7f).contains(&b) && b != b'%'
}

/// Whether every byte of `bytes` is [`plain`]: sixteen bytes at a time (a
/// vector compare each), the last sixteen overlapping the chunk before them;
/// eight and eight for an ID of 8 to 15 bytes. A single fold over all the
/// bytes is vectorized too, but leaves up to 15 bytes to a byte-at-a-time
/// tail, which for typical request IDs (`chatcmpl-` and a UUID) is most of
/// the cost.
fn all_plain(bytes: &[u8]) -> bool {
    fn each(bytes: &[u8]) -> bool {
        bytes.iter().fold(true, |all, &b| all & plain(b))
    }
    if let Some(last) = bytes.last_chunk::<16>() {
        let (chunks, _) = bytes.as_chunks::<16>();
        return chunks.iter().all(|chunk| each(chunk)) && each(last);
    }
    match (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        (Some(first), Some(last)) => each(first) & each(last),
        _ => each(bytes),
    }
}

/// Appends [`msg_id`]'s value for `request_id` to `out`: ASCII only.
fn push_msg_id(out: &mut Vec<u8>, request_id: &str) {
    out.extend_from_slice(MSG_ID_PREFIX);
    if all_plain(request_id.as_bytes()) {
        out.extend_from_slice(request_id.as_bytes());
        return;
    }
    for b in request_id.bytes() {
        if plain(b) {
            out.push(b);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        }
    }
}

/// The headers every dead letter carries: its code, a sentence saying why,
/// and the subject the input came from, with control characters replaced
/// and the sentence's length bounded ([`header_safe`]).
pub fn dead_letter_headers(code: DeadLetterCode, why: &str, source_subject: &str) -> Headers {
    let mut headers = Headers::new();
    headers.push("Handoff-Error-Code", code.as_str());
    headers.push("Handoff-Error", &header_safe(why));
    headers.push("Handoff-Source-Subject", &header_safe(source_subject));
    headers
}

/// Header of a dead letter sent without the input's bytes, because even the
/// input alone does not fit the server's `max_payload` once the dead letter's
/// headers are added: how many bytes the input had.
pub const PAYLOAD_OMITTED: &str = "Handoff-Payload-Omitted";

/// A dead letter's headers for when the input's bytes cannot go with it: the
/// same headers plus [`PAYLOAD_OMITTED`] with the input's size.
pub fn without_payload(set: &Headers, bytes: usize) -> Headers {
    let mut set = set.clone();
    set.push(PAYLOAD_OMITTED, &bytes.to_string());
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
        headers.push("Content-Type", ct);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_held_as_their_block_and_read_back_as_set() {
        let mut h = Headers::new();
        assert!(h.is_empty() && h.as_bytes().is_empty() && h.get("A").is_none());
        h.push("Content-Type", "application/json");
        h.push("Handoff-Error", "one\r\ntwo\n: three");
        assert_eq!(
            h.as_bytes(),
            b"NATS/1.0\r\nContent-Type: application/json\r\nHandoff-Error: one  two : three\r\n"
        );
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            vec![
                ("Content-Type", "application/json"),
                ("Handoff-Error", "one  two : three")
            ]
        );
        assert_eq!(h.get("Handoff-Error"), Some("one  two : three"));
        assert_eq!(h.get("content-type"), None, "names match exactly");
        assert_eq!(
            format!("{h:?}"),
            format!("{:?}", h.iter().collect::<Vec<_>>())
        );
    }

    #[test]
    fn the_msg_id_header_is_the_msg_id_with_room_for_the_closing_crlf() {
        for id in ["r-1", "a b%c\u{e9}\r\n", ""] {
            let h = Headers::msg_id(id);
            let mut pushed = Headers::new();
            pushed.push("Nats-Msg-Id", &msg_id(id));
            assert_eq!(h, pushed, "{id:?}");
            assert_eq!(h.get("Nats-Msg-Id"), Some(msg_id(id).as_str()));
            assert!(h.as_bytes().is_ascii());
            if id != "a b%c\u{e9}\r\n" {
                assert_eq!(h.block.capacity(), h.block.len() + 2, "exact: {id:?}");
            }
        }
        assert_eq!(msg_id("a b%c\u{e9}"), "handoff-a%20b%25c%C3%A9");
    }

    #[test]
    fn all_plain_is_every_byte_plain_whatever_the_length_and_the_position() {
        for len in 0..=50 {
            let id = vec![b'a'; len];
            assert!(all_plain(&id), "{len} plain bytes");
            for at in 0..len {
                for bad in [b' ', b'%', b'\n', 0x7f, 0x80, 0xff, 0] {
                    let mut id = id.clone();
                    id[at] = bad;
                    assert!(!all_plain(&id), "{len} bytes, {bad:#x} at {at}");
                }
            }
        }
    }
}
