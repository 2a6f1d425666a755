//! The messages the tests publish and read, built one way: MessagePack of a
//! JSON value (rmp-serde, not the worker's codec, so a codec fault cannot
//! cancel out), the terminal result most tests need, and an output read
//! back as JSON.

use async_nats::{HeaderMap, Message};
use serde_json::{Value as Json, json};

/// MessagePack (named fields) of a JSON value.
pub fn msgpack(value: &Json) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encode msgpack")
}

/// A terminal prefill result for `request_id` (`finish_reason: "eos"`, no
/// handoff params: needs no ID), answered on `llm.replies.{request_id}`.
pub fn terminal(request_id: &str) -> Json {
    json!({
        "request_id": request_id,
        "reply_to": format!("llm.replies.{request_id}"),
        "frames": [{"token_ids": [42], "text": "x", "finish_reason": "eos"}],
    })
}

/// A MessagePack or JSON output (by its `Content-Type`), as a JSON value.
pub fn decode_output(message: &Message) -> Json {
    if header(message.headers.as_ref(), "Content-Type") == Some("application/json") {
        serde_json::from_slice(&message.payload).expect("JSON output")
    } else {
        rmp_serde::from_slice(&message.payload).expect("MessagePack output")
    }
}

/// A header's value, by exact name.
pub fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get(name).map(|v| v.as_str())
}
