//! Reading a few top-level fields of a body without building the rest.
//!
//! Used when a body is too large to read as a value tree (see
//! `decision::decide`): the decision still wants its reply subject and
//! request ID, to answer the requester instead of only dead-lettering.

use super::{Encoding, count::skip_msgpack, msgpack};
use rmpv::Value;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// How many entries under one wanted key are kept: two are enough to tell
/// that a key is duplicated, which makes it unusable.
const KEEP_PER_KEY: usize = 2;

/// The entries of a top-level map whose key is one of `keys`, in order (at
/// most two per key). Scalars come as they are; an array or map comes as an
/// empty one of its kind (its contents are not read). `None` when the body is
/// not a map or not readable as far as its top level goes.
pub fn top_level(bytes: &[u8], encoding: Encoding, keys: &[&str]) -> Option<Vec<(Value, Value)>> {
    match encoding {
        Encoding::MsgPack => msgpack_top(bytes, keys),
        Encoding::Json => {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            let out = de.deserialize_map(Top { keys }).ok()?;
            de.end().ok()?;
            Some(out)
        }
    }
}

fn keep(out: &[(Value, Value)], key: &str, keys: &[&str]) -> bool {
    keys.contains(&key)
        && out.iter().filter(|(k, _)| k.as_str() == Some(key)).count() < KEEP_PER_KEY
}

fn msgpack_top(bytes: &[u8], keys: &[&str]) -> Option<Vec<(Value, Value)>> {
    let marker = *bytes.first()?;
    let (n, mut pos) = match marker {
        0x80..=0x8f => (usize::from(marker & 0x0f), 1),
        0xde => (
            usize::from(u16::from_be_bytes([*bytes.get(1)?, *bytes.get(2)?])),
            3,
        ),
        0xdf => {
            let raw: [u8; 4] = bytes.get(1..5)?.try_into().ok()?;
            (usize::try_from(u32::from_be_bytes(raw)).ok()?, 5)
        }
        _ => return None,
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let key_end = skip_msgpack(bytes, pos)?;
        let value_end = skip_msgpack(bytes, key_end)?;
        let key = msgpack::read(bytes.get(pos..key_end)?).ok();
        if let Some(name) = key.as_ref().and_then(Value::as_str)
            && keep(&out, name, keys)
        {
            let raw = bytes.get(key_end..value_end)?;
            let value = match raw.first()? {
                0x80..=0x8f | 0xde | 0xdf => Value::Map(Vec::new()),
                0x90..=0x9f | 0xdc | 0xdd => Value::Array(Vec::new()),
                _ => msgpack::read(raw).ok()?,
            };
            out.push((Value::from(name), value));
        }
        pos = value_end;
    }
    (pos == bytes.len()).then_some(out)
}

/// The top-level JSON map, keeping the wanted entries.
struct Top<'k> {
    keys: &'k [&'k str],
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = Vec<(Value, Value)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if keep(&out, &key, self.keys) {
                let value = map.next_value_seed(Shallow)?;
                out.push((Value::from(key.as_ref()), value));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
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

    #[test]
    fn keeps_wanted_scalars_and_empties_containers() {
        let body = Value::Map(vec![
            (Value::from("frames"), Value::Array(vec![Value::Nil; 100])),
            (Value::from("reply_to"), Value::from("_INBOX.a")),
            (Value::from("request_id"), Value::Array(vec![Value::Nil; 3])),
            (Value::from("reply_to"), Value::from("_INBOX.b")),
            (Value::from("reply_to"), Value::from("_INBOX.c")),
        ]);
        let want = vec![
            (Value::from("reply_to"), Value::from("_INBOX.a")),
            (Value::from("request_id"), Value::Array(Vec::new())),
            (Value::from("reply_to"), Value::from("_INBOX.b")),
        ];
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            let bytes = encode(&body, encoding);
            let got = top_level(&bytes, encoding, &["reply_to", "request_id"]);
            assert_eq!(got.as_ref(), Some(&want), "{encoding:?}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_map_has_no_top_level() {
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            let bytes = encode(&Value::Array(vec![Value::Nil]), encoding);
            assert_eq!(top_level(&bytes, encoding, &["reply_to"]), None);
        }
        assert_eq!(
            top_level(&[0x81, 0xa1, b'a'], Encoding::MsgPack, &["a"]),
            None
        );
    }
}
