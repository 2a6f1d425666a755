//! Reading `reply_to` and `request_id` from the first few KiB of a body that
//! is not going to be decided (the byte budget refused it), to tell its
//! client so. Never reads past [`PEEK_BYTES`]: a refusal costs the same
//! whatever the body's size.
//!
//! MessagePack is read with the in-place scanner ([`super::scan`]), JSON with
//! serde_json on the prefix; either stops at the first value cut off by the
//! prefix's end, keeping what it read before.

use super::{Encoding, scan};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use std::fmt;

/// How much of a body is looked at.
pub const PEEK_BYTES: usize = 4096;

/// The longest `request_id` the contract accepts (as the decision has it).
const MAX_REQUEST_ID_BYTES: usize = crate::decision::MAX_REQUEST_ID_BYTES;

/// What the first [`PEEK_BYTES`] of a body say about where its answer goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peeked {
    pub reply_to: ReplyTo,
    /// A string `request_id` of 1..=256 bytes, when read before the cut.
    pub request_id: Option<String>,
}

/// The body's `reply_to`, as far as the prefix shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReplyTo {
    /// Not among the top-level entries read (it may come later).
    #[default]
    NotSeen,
    /// A string, given once so far.
    Found(String),
    /// Present but not usable: not a UTF-8 string, or given twice. The
    /// decision would refuse it too; nothing is answered.
    Unusable,
}

/// Peeks at `body`'s top-level `reply_to` and `request_id`.
pub fn peek(body: &[u8], encoding: Encoding) -> Peeked {
    let prefix = &body[..body.len().min(PEEK_BYTES)];
    let mut out = Peeked::default();
    match encoding {
        Encoding::MsgPack => peek_msgpack(prefix, &mut out),
        Encoding::Json => {
            // An error is where the prefix ends (or the body goes wrong):
            // what was read before it stays in `out`.
            let mut de = serde_json::Deserializer::from_slice(prefix);
            let _ = de.deserialize_map(Top { out: &mut out });
        }
    }
    out
}

fn peek_msgpack(prefix: &[u8], out: &mut Peeked) {
    let Some((_, mut spans)) = scan::entries(prefix) else {
        return;
    };
    // `Spans` yields `None` at the first key or value cut off by the prefix.
    while let (Some(key), Some(value)) = (spans.next(), spans.next()) {
        let text = scan::str_bytes(value).and_then(|v| std::str::from_utf8(v).ok());
        match scan::str_bytes(key) {
            Some(b"reply_to") => out.saw_reply_to(text),
            Some(b"request_id") => out.saw_request_id(text),
            _ => {}
        }
    }
}

impl Peeked {
    fn saw_reply_to(&mut self, value: Option<&str>) {
        self.reply_to = match (&self.reply_to, value) {
            (ReplyTo::NotSeen, Some(subject)) => ReplyTo::Found(subject.to_string()),
            _ => ReplyTo::Unusable,
        };
    }

    fn saw_request_id(&mut self, value: Option<&str>) {
        // A second one makes the result malformed: no ID to echo.
        let usable = value.filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID_BYTES);
        self.request_id = match self.request_id {
            None => usable.map(str::to_string),
            Some(_) => None,
        };
    }
}

/// The top-level map of a JSON body, read entry by entry into `out`.
struct Top<'a> {
    out: &'a mut Peeked,
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "reply_to" | "request_id" => {
                    let value = map.next_value::<serde_json::Value>()?;
                    if key == "reply_to" {
                        self.out.saw_reply_to(value.as_str());
                    } else {
                        self.out.saw_request_id(value.as_str());
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::encode;
    use rmpv::Value;

    fn body(pairs: &[(&str, Value)], filler: usize) -> Value {
        let mut entries: Vec<(Value, Value)> = pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect();
        entries.push((Value::from("frames"), Value::from("x".repeat(filler))));
        Value::Map(entries)
    }

    fn both(value: &Value) -> [Peeked; 2] {
        [Encoding::MsgPack, Encoding::Json].map(|e| peek(&encode(value, e), e))
    }

    #[test]
    fn reads_reply_to_and_request_id_before_a_large_rest() {
        let value = body(
            &[
                ("request_id", Value::from("r1")),
                ("reply_to", Value::from("_INBOX.a")),
            ],
            1 << 20,
        );
        for peeked in both(&value) {
            assert_eq!(peeked.reply_to, ReplyTo::Found("_INBOX.a".into()));
            assert_eq!(peeked.request_id.as_deref(), Some("r1"));
        }
    }

    #[test]
    fn a_reply_to_past_the_prefix_is_not_seen() {
        let mut value = body(&[], 2 * PEEK_BYTES);
        if let Value::Map(entries) = &mut value {
            entries.push((Value::from("reply_to"), Value::from("_INBOX.late")));
        }
        for peeked in both(&value) {
            assert_eq!(peeked.reply_to, ReplyTo::NotSeen);
        }
    }

    #[test]
    fn a_duplicated_or_non_string_reply_to_is_unusable() {
        let twice = Value::Map(vec![
            (Value::from("reply_to"), Value::from("_INBOX.a")),
            (Value::from("reply_to"), Value::from("_INBOX.b")),
        ]);
        let number = body(&[("reply_to", Value::from(7))], 10);
        for value in [twice, number] {
            for peeked in both(&value) {
                assert_eq!(peeked.reply_to, ReplyTo::Unusable, "{value}");
            }
        }
    }

    #[test]
    fn not_a_map_or_garbage_says_nothing() {
        for bytes in [
            &b""[..],
            b"\xc1\xc1",
            b"[1,2]",
            b"{\"reply_to\": ",
            b"\x91\xa1x",
        ] {
            for encoding in [Encoding::MsgPack, Encoding::Json] {
                assert_eq!(peek(bytes, encoding).reply_to, ReplyTo::NotSeen);
            }
        }
    }

    #[test]
    fn an_overlong_request_id_is_not_echoed() {
        let long = "r".repeat(MAX_REQUEST_ID_BYTES + 1);
        let value = body(
            &[
                ("request_id", Value::from(long)),
                ("reply_to", Value::from("_INBOX.a")),
            ],
            10,
        );
        for peeked in both(&value) {
            assert_eq!(peeked.request_id, None);
            assert_eq!(peeked.reply_to, ReplyTo::Found("_INBOX.a".into()));
        }
    }
}
