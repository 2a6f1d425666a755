//! Wire encodings: MessagePack with named fields (the default) and JSON.
//!
//! Messages are held as [`rmpv::Value`] trees rather than typed structs so that
//! every field we do not interpret — including MessagePack binary and ext
//! values, and keys that are not strings — flows through a decode → re-encode
//! round trip byte-for-byte equivalent. New upstream fields need no release.

pub mod map;
pub mod messages;

use rmpv::Value;
use thiserror::Error;

/// How deep a message may nest before it is refused as malformed. Real prefill
/// results nest four or five levels; a hostile one must not exhaust the stack.
pub const MAX_DEPTH: usize = 64;

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
}

/// Decodes one complete value. Trailing bytes, nesting deeper than
/// [`MAX_DEPTH`] and truncated input are errors.
pub fn decode(bytes: &[u8], encoding: Encoding) -> Result<Value, WireError> {
    if bytes.is_empty() {
        return Err(WireError::Empty);
    }
    match encoding {
        Encoding::MsgPack => {
            let mut cursor = bytes;
            let value = rmpv::decode::read_value_with_max_depth(&mut cursor, MAX_DEPTH)
                .map_err(|e| WireError::MsgPack(e.to_string()))?;
            if !cursor.is_empty() {
                return Err(WireError::TrailingBytes(cursor.len()));
            }
            Ok(value)
        }
        Encoding::Json => {
            // serde_json refuses nesting beyond 128 levels on its own.
            serde_json::from_slice::<Value>(bytes).map_err(|e| WireError::Json(e.to_string()))
        }
    }
}

/// Encodes a value. MessagePack keeps binary, ext and non-string keys as they
/// came; JSON output only ever carries values that came from JSON input or
/// that the worker built itself.
pub fn encode(value: &Value, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::MsgPack => {
            let mut out = Vec::with_capacity(256);
            // Writing into a Vec cannot fail.
            let _ = rmpv::encode::write_value(&mut out, value);
            out
        }
        Encoding::Json => json::to_vec(value),
    }
}

mod json;
