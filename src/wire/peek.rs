//! Reading a body's top-level `reply_to` and `request_id` without reading
//! the rest, to answer the client of a body that is not going to be decided:
//! one the byte budget refused ([`peek`], which reads only its first
//! [`PEEK_BYTES`], so a refusal costs the same whatever the body's size), or
//! one too complex to read as a value tree ([`top_level`] on the whole body,
//! see `decision::complex`).
//!
//! MessagePack in any valid encoding is walked with [`scan::any_end`], JSON
//! read with serde_json. Either stops at the first entry that does not read
//! (cut off by the prefix's end, or invalid), keeping those before it.

use super::messages::MAX_REQUEST_ID_BYTES;
use super::{Encoding, msgpack, scan};
use rmpv::Value;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// How much of a body [`peek`] looks at.
pub const PEEK_BYTES: usize = 4096;

/// The top-level keys kept.
const KEYS: [&str; 2] = ["reply_to", "request_id"];

/// How many entries under one key are kept: two are enough to tell that a
/// key is duplicated, which makes it unusable.
const KEEP_PER_KEY: usize = 2;

/// The top-level `reply_to` and `request_id` entries of a body, as far as
/// they were read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Top {
    /// The kept entries in order, at most two per key: scalars as they are,
    /// an array or map as an empty one of its kind (its contents unread).
    pub entries: Vec<(Value, Value)>,
    /// Whether the body is one map, read to its end.
    pub whole: bool,
}

/// The body's `reply_to`, as far as it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyTo {
    /// Not among the top-level entries read (it may come later).
    NotSeen,
    /// A string, given once so far.
    Found(String),
    /// Present but not usable: not a UTF-8 string, or given twice. The
    /// decision would refuse it too; nothing is answered.
    Unusable,
}

/// The top-level entries of the first [`PEEK_BYTES`] of `body`.
pub fn peek(body: &[u8], encoding: Encoding) -> Top {
    top_level(&body[..body.len().min(PEEK_BYTES)], encoding)
}

/// The top-level entries of `bytes`.
pub fn top_level(bytes: &[u8], encoding: Encoding) -> Top {
    let mut top = Top::default();
    match encoding {
        Encoding::MsgPack => top.whole = msgpack_top(bytes, &mut top.entries).is_some(),
        Encoding::Json => {
            // An error is where the prefix ends (or the body goes wrong):
            // what was read before it stays in `top`.
            let mut de = serde_json::Deserializer::from_slice(bytes);
            let read = de.deserialize_map(JsonTop {
                out: &mut top.entries,
            });
            top.whole = read.is_ok() && de.end().is_ok();
        }
    }
    top
}

impl Top {
    fn given(&self, key: &str) -> impl Iterator<Item = &Value> {
        let key = Some(key);
        self.entries
            .iter()
            .filter(move |(k, _)| k.as_str() == key)
            .map(|(_, v)| v)
    }

    pub fn reply_to(&self) -> ReplyTo {
        let mut given = self.given("reply_to");
        match (given.next(), given.next()) {
            (None, _) => ReplyTo::NotSeen,
            (Some(Value::String(s)), None) => s
                .as_str()
                .map_or(ReplyTo::Unusable, |s| ReplyTo::Found(s.into())),
            _ => ReplyTo::Unusable,
        }
    }

    /// The `request_id` to echo: given once, as a UTF-8 string of 1 to
    /// [`MAX_REQUEST_ID_BYTES`] bytes (of two, which is meant cannot be
    /// known).
    pub fn request_id(&self) -> Option<String> {
        let mut given = self.given("request_id");
        match (given.next(), given.next()) {
            (Some(Value::String(s)), None) => s
                .as_str()
                .filter(|id| (1..=MAX_REQUEST_ID_BYTES).contains(&id.len()))
                .map(str::to_string),
            _ => None,
        }
    }
}

fn keep(out: &[(Value, Value)], key: &str) -> bool {
    KEYS.contains(&key)
        && out.iter().filter(|(k, _)| k.as_str() == Some(key)).count() < KEEP_PER_KEY
}

/// Reads the top-level map's entries into `out`; `Some` when the body is
/// one map, read to its end.
fn msgpack_top(bytes: &[u8], out: &mut Vec<(Value, Value)>) -> Option<()> {
    let head = scan::head(bytes, 0).ok()?;
    let scan::Kind::Map(n) = head.kind else {
        return None;
    };
    let mut pos = head.next;
    for _ in 0..n {
        let mut budget = usize::MAX;
        let key_end = scan::any_end(bytes, pos, 1, &mut budget).ok()?;
        let end = scan::any_end(bytes, key_end, 1, &mut budget).ok()?;
        let key = scan::str_bytes(bytes.get(pos..key_end)?).map(std::str::from_utf8);
        if let Some(Ok(name)) = key
            && keep(out, name)
        {
            let value = match scan::head(bytes, key_end).ok()?.kind {
                scan::Kind::Map(_) => Value::Map(Vec::new()),
                scan::Kind::Array(_) => Value::Array(Vec::new()),
                _ => msgpack::read(bytes.get(key_end..end)?).ok()?,
            };
            out.push((Value::from(name), value));
        }
        pos = end;
    }
    (pos == bytes.len()).then_some(())
}

/// The top-level JSON map, keeping the wanted entries in `out` as they are
/// read.
struct JsonTop<'a> {
    out: &'a mut Vec<(Value, Value)>,
}

impl<'de> Visitor<'de> for JsonTop<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if keep(self.out, &key) {
                let value = map.next_value_seed(Shallow)?;
                self.out.push((Value::from(key.as_ref()), value));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// A JSON value as a scalar, or an empty array or map in place of a full one.
struct Shallow;

impl<'de> DeserializeSeed<'de> for Shallow {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Shallow {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Boolean(b))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Value::F64(f))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::from(s))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Nil)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Map(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::encode;

    fn body(pairs: &[(&str, Value)], filler: usize) -> Value {
        let mut entries: Vec<(Value, Value)> = pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect();
        entries.push((Value::from("frames"), Value::from("x".repeat(filler))));
        Value::Map(entries)
    }

    fn both(value: &Value) -> [Top; 2] {
        [Encoding::MsgPack, Encoding::Json].map(|e| peek(&encode(value, e), e))
    }

    #[test]
    fn keeps_wanted_scalars_and_empties_containers() {
        let body = Value::Map(vec![
            (Value::from("frames"), Value::Array(vec![Value::Nil; 100])),
            (Value::from("reply_to"), Value::from("_INBOX.a")),
            (Value::from("request_id"), Value::Array(vec![Value::Nil; 3])),
            (Value::from("reply_to"), Value::from("_INBOX.b")),
            (Value::from("reply_to"), Value::from("_INBOX.c")),
        ]);
        let entries = vec![
            (Value::from("reply_to"), Value::from("_INBOX.a")),
            (Value::from("request_id"), Value::Array(Vec::new())),
            (Value::from("reply_to"), Value::from("_INBOX.b")),
        ];
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            let bytes = encode(&body, encoding);
            let top = top_level(&bytes, encoding);
            assert_eq!(top.entries, entries, "{encoding:?}");
            assert!(top.whole, "{encoding:?}");
        }
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
        for top in both(&value) {
            assert_eq!(top.reply_to(), ReplyTo::Found("_INBOX.a".into()));
            assert_eq!(top.request_id().as_deref(), Some("r1"));
            assert!(!top.whole, "only a prefix was read");
        }
    }

    #[test]
    fn a_reply_to_past_the_prefix_is_not_seen() {
        let mut value = body(&[], 2 * PEEK_BYTES);
        if let Value::Map(entries) = &mut value {
            entries.push((Value::from("reply_to"), Value::from("_INBOX.late")));
        }
        for top in both(&value) {
            assert_eq!(top.reply_to(), ReplyTo::NotSeen);
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
            for top in both(&value) {
                assert_eq!(top.reply_to(), ReplyTo::Unusable, "{value}");
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
            b"\x81\xa1a",
        ] {
            for encoding in [Encoding::MsgPack, Encoding::Json] {
                let top = top_level(bytes, encoding);
                assert_eq!(top.reply_to(), ReplyTo::NotSeen);
                assert!(!top.whole);
            }
        }
    }

    #[test]
    fn a_request_id_is_echoed_only_when_given_once_and_usable() {
        let long = "r".repeat(MAX_REQUEST_ID_BYTES + 1);
        let twice = [
            ("request_id", Value::from("r1")),
            ("request_id", Value::from("r2")),
        ];
        for pairs in [&[("request_id", Value::from(long))][..], &twice] {
            let mut pairs = pairs.to_vec();
            pairs.push(("reply_to", Value::from("_INBOX.a")));
            for top in both(&body(&pairs, 10)) {
                assert_eq!(top.request_id(), None);
                assert_eq!(top.reply_to(), ReplyTo::Found("_INBOX.a".into()));
            }
        }
    }
}
