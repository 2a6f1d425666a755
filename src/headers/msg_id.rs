//! The values of `Nats-Msg-Id`: a decode job's and a KV release notice's,
//! from the request ID, escaped so that distinct request IDs keep distinct
//! message IDs.

const MSG_ID_PREFIX: &str = "handoff-";
const RELEASE_PREFIX: &str = "release-";

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
/// for a request ID of plain bytes. Written as a `String` from the start:
/// every byte of it is ASCII, so no UTF-8 check of the result is needed.
fn prefixed_msg_id(prefix: &str, request_id: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + request_id.len());
    out.push_str(prefix);
    if all_plain(request_id.as_bytes()) {
        out.push_str(request_id);
        return out;
    }
    for b in request_id.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
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
