//! JSON output for [`rmpv::Value`] trees.
//!
//! Values decoded from JSON always serialize directly. Anything JSON cannot
//! express (non-string map keys, binary, ext, invalid UTF-8) can only appear
//! when a caller mixes encodings; it is rendered losslessly enough to read
//! rather than refused, so that an output is always produced.

use rmpv::Value;
use serde_json::Value as Json;

pub(super) fn to_vec(value: &Value) -> Vec<u8> {
    match serde_json::to_vec(value) {
        Ok(bytes) => bytes,
        Err(_) => serde_json::to_vec(&to_json(value)).unwrap_or_else(|_| b"null".to_vec()),
    }
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
