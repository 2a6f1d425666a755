//! Wire encodings: MessagePack with named fields (the default) and JSON.
//!
//! Messages are held as [`rmpv::Value`] trees rather than typed structs so that
//! every field we do not interpret — including MessagePack binary and ext
//! values, and keys that are not strings — flows through a decode → re-encode
//! round trip byte-for-byte equivalent. New upstream fields need no release.

mod count;
pub mod map;
pub mod messages;
pub mod msgpack;
pub mod peek;
pub mod scan;

pub use count::more_values_than;
pub use json::{Field, Plan, json_to_msgpack, msgpack_to_json};

use rmpv::Value;
use thiserror::Error;

/// How many arrays and maps may nest inside each other (the outermost map
/// counts as one) before a message is refused as malformed. Real prefill
/// results nest four or five levels, a request with a JSON-schema tool a
/// dozen or two; a hostile one must not exhaust the stack.
pub const MAX_DEPTH: usize = 64;

/// Whether a container may open inside `depth` containers: the nesting
/// bound ([`MAX_DEPTH`]) for every reader that tracks depth, in either
/// encoding.
#[inline(always)]
pub fn may_open(depth: usize) -> bool {
    depth < MAX_DEPTH
}

/// The encoding of one message. Outputs use the encoding of the input that
/// caused them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    MsgPack,
    Json,
}

impl Encoding {
    /// The encoding named by a `Content-Type` header value: JSON for
    /// `application/json` (parameters such as `; charset=utf-8` allowed),
    /// MessagePack for anything else or no header at all.
    pub fn from_content_type(content_type: Option<&str>) -> Encoding {
        match content_type {
            Some(v) => {
                let media = v.split(';').next().unwrap_or("").trim();
                if media.eq_ignore_ascii_case("application/json") {
                    Encoding::Json
                } else {
                    Encoding::MsgPack
                }
            }
            None => Encoding::MsgPack,
        }
    }

    /// The `Content-Type` header value outputs in this encoding carry, if any.
    pub fn content_type(self) -> Option<&'static str> {
        match self {
            Encoding::MsgPack => None,
            Encoding::Json => Some("application/json"),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::MsgPack => "msgpack",
            Encoding::Json => "json",
        }
    }
}

/// Why bytes could not be read as one message.
#[derive(Debug, Error)]
pub enum WireError {
    #[error("the body is not valid MessagePack: {0}")]
    MsgPack(String),
    #[error("the body is not valid JSON: {0}")]
    Json(String),
    #[error("the body holds {0} trailing bytes after one complete MessagePack value")]
    TrailingBytes(usize),
    #[error("the body is empty; a prefill result is a map")]
    Empty,
    #[error("the body nests arrays and maps more than {MAX_DEPTH} levels deep")]
    TooDeep,
}

/// Decodes one complete value. Trailing bytes, nesting deeper than
/// [`MAX_DEPTH`] containers, undefined MessagePack markers and truncated input
/// are errors.
pub fn decode(bytes: &[u8], encoding: Encoding) -> Result<Value, WireError> {
    if bytes.is_empty() {
        return Err(WireError::Empty);
    }
    match encoding {
        Encoding::MsgPack => msgpack::read(bytes),
        Encoding::Json => {
            // serde_json refuses nesting beyond 128 levels on its own, which
            // bounds the recursion of the check below.
            let value = serde_json::from_slice::<Value>(bytes).map_err(|e| {
                if e.to_string().starts_with("recursion limit exceeded") {
                    WireError::TooDeep
                } else {
                    WireError::Json(e.to_string())
                }
            })?;
            if depth(&value) > MAX_DEPTH {
                return Err(WireError::TooDeep);
            }
            Ok(value)
        }
    }
}

/// How many arrays and maps nest inside each other at the deepest point: 0
/// for a scalar, 1 for a flat map.
pub fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| depth(k).max(depth(v)))
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// Encodes a message the worker built itself (its strings, integers and
/// string keys, which JSON always carries) or decoded from the same
/// encoding. MessagePack keeps binary, ext and non-string keys as they
/// came; a value JSON cannot carry is written as [`to_json`] renders it.
/// Outputs that carry an input's values into JSON go through
/// [`try_encode`], which refuses what JSON cannot carry.
pub fn encode(value: &Value, encoding: Encoding) -> Vec<u8> {
    try_encode(value, encoding, 256)
        .unwrap_or_else(|_| json::to_json(value).to_string().into_bytes())
}

/// Encodes a value, or says what in it JSON cannot carry (binary, ext, a
/// key that is not a string, a string that is not UTF-8, a non-finite
/// float). MessagePack always encodes. `capacity`: a hint of the encoded
/// size (saves regrowing the buffer when an output is about as large as
/// its input).
pub fn try_encode(value: &Value, encoding: Encoding, capacity: usize) -> Result<Vec<u8>, NotJson> {
    match encoding {
        Encoding::MsgPack => {
            let mut out = Vec::with_capacity(capacity);
            msgpack::write(&mut out, value);
            Ok(out)
        }
        Encoding::Json => json::to_vec(value),
    }
}

/// A short description of a value for error messages: its type, and the value
/// itself when it is short.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "null".into(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::F32(f) => format!("the float {f}"),
        Value::F64(f) => format!("the float {f}"),
        Value::String(s) => match s.as_str() {
            Some(s) if s.len() <= 64 => format!("the string {s:?}"),
            Some(s) => format!("a string of {} bytes", s.len()),
            None => "a string that is not valid UTF-8".into(),
        },
        Value::Binary(b) => format!("binary data of {} bytes", b.len()),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Map(m) => format!("a map of {} entries", m.len()),
        Value::Ext(t, _) => format!("a MessagePack ext value of type {t}"),
    }
}

/// An output that cannot be written as JSON: what in it JSON cannot carry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct NotJson(pub String);

/// A value as JSON, for printing (`explain`). Values that came from JSON map
/// one to one; binary becomes an array of byte values, ext becomes
/// `{"ext_type", "data"}`, non-string keys their display form and invalid
/// UTF-8 is replaced (U+FFFD).
pub fn to_json(value: &Value) -> serde_json::Value {
    json::to_json(value)
}

mod json;
