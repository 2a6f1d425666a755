//! JSON output for [`rmpv::Value`] trees, and JSON to MessagePack and back
//! without them.
//!
//! [`to_vec`] writes exactly what JSON carries (null, booleans, integers,
//! finite floats, UTF-8 strings, arrays, maps with string keys) and refuses
//! anything else: an output that cannot be written is an error, never a
//! stand-in. [`to_json`] renders anything readably, for printing
//! (`explain`) and for the messages the worker builds itself.

use super::NotJson;
use rmpv::Value;
use serde::ser::{Error as _, Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value as Json;

/// `value` as compact JSON, as serde_json writes it, or what in it JSON
/// cannot carry.
pub(super) fn to_vec(value: &Value) -> Result<Vec<u8>, NotJson> {
    serde_json::to_vec(&Strict(value))
        .map_err(|e| NotJson(format!("it holds {e}, which JSON cannot carry")))
}

/// A value serialized as rmpv serializes it, except that what JSON cannot
/// carry is an error (rmpv would write binary as an array of numbers, an
/// ext value as an array, a non-finite float as null).
struct Strict<'a>(&'a Value);

impl Serialize for Strict<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Nil => s.serialize_unit(),
            Value::Boolean(b) => s.serialize_bool(*b),
            Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
                (Some(u), _) => s.serialize_u64(u),
                (None, Some(n)) => s.serialize_i64(n),
                (None, None) => Err(S::Error::custom("an integer out of range")),
            },
            Value::F32(f) if f.is_finite() => s.serialize_f32(*f),
            Value::F64(f) if f.is_finite() => s.serialize_f64(*f),
            Value::F32(_) | Value::F64(_) => Err(S::Error::custom("a float that is not finite")),
            Value::String(text) => match text.as_str() {
                Some(text) => s.serialize_str(text),
                None => Err(S::Error::custom("a string that is not UTF-8")),
            },
            Value::Binary(_) => Err(S::Error::custom("a binary value")),
            Value::Ext(tag, _) => Err(S::Error::custom(format!("an ext value of type {tag}"))),
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Strict(item))?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    let Some(key) = key.as_str() else {
                        return Err(S::Error::custom("a map key that is not a UTF-8 string"));
                    };
                    map.serialize_entry(key, &Strict(value))?;
                }
                map.end()
            }
        }
    }
}

/// A JSON body as MessagePack, or `None` when it is not one JSON value
/// (what [`super::decode`] refuses as invalid JSON is refused here too).
/// Values are written as decoding the body into a value tree and encoding
/// that would write them (serde_json reads both ways; rmp-serde writes the
/// smallest form of each number and string, as rmpv does).
pub fn json_to_msgpack(json: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(json.len());
    let mut reader = serde_json::Deserializer::from_slice(json);
    let mut writer = rmp_serde::Serializer::new(&mut out);
    serde_transcode::transcode(&mut reader, &mut writer).ok()?;
    reader.end().ok()?;
    Some(out)
}

/// MessagePack the worker wrote for a JSON result as JSON, as [`to_vec`]
/// writes its value tree; or why it cannot be. Such output holds the
/// result's own values, read from JSON, and the worker's strings and
/// integers; a map key JSON cannot name is refused.
pub fn msgpack_to_json(msgpack: &[u8], capacity: usize) -> Result<Vec<u8>, NotJson> {
    let mut out = Vec::with_capacity(capacity);
    let mut reader = rmp_serde::Deserializer::from_read_ref(msgpack);
    let mut writer = serde_json::Serializer::new(&mut out);
    serde_transcode::transcode(&mut reader, &mut writer)
        .map_err(|e| NotJson(format!("it holds {e}, which JSON cannot carry")))?;
    Ok(out)
}

pub(super) fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => {
            if let Some(u) = i.as_u64() {
                Json::from(u)
            } else if let Some(s) = i.as_i64() {
                Json::from(s)
            } else {
                Json::Null
            }
        }
        Value::F32(f) => {
            serde_json::Number::from_f64(f64::from(*f)).map_or(Json::Null, Json::Number)
        }
        Value::F64(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Value::Binary(b) => Json::Array(b.iter().map(|x| Json::from(*x)).collect()),
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| (key_string(k), to_json(v)))
                .collect(),
        ),
        Value::Ext(tag, data) => serde_json::json!({
            "ext_type": tag,
            "data": data,
        }),
    }
}

fn key_string(key: &Value) -> String {
    match key {
        Value::String(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => other.to_string(),
    }
}
