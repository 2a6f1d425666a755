//! Per-message TTL on the GEN stream (`allow_msg_ttl`, nats-server 2.11+),
//! so that a decode job published with `Nats-TTL` leaves the stream at its
//! deadline.
//!
//! Read and switched on with raw JetStream API requests: the client's stream
//! configuration has the field only with its `server_2_11` feature, which
//! would also send 2.11-only consumer fields to the 2.9 servers this worker
//! supports.

use super::JetStreamError;
use async_nats::jetstream;
use serde_json::Value;

/// Whether `stream` expires messages by their `Nats-TTL` header.
pub async fn msg_ttl_enabled(
    js: &jetstream::Context,
    stream: &str,
) -> Result<bool, JetStreamError> {
    Ok(stream_config(js, stream)
        .await?
        .get("allow_msg_ttl")
        .and_then(Value::as_bool)
        == Some(true))
}

/// The stream's configuration as the server holds it, every field kept.
async fn stream_config(js: &jetstream::Context, stream: &str) -> Result<Value, JetStreamError> {
    let failed = |why: String| {
        JetStreamError::Api(format!(
            "reading the configuration of stream {stream}: {why}"
        ))
    };
    let info: Value = js
        .request(format!("STREAM.INFO.{stream}"), &())
        .await
        .map_err(|e| failed(e.to_string()))?;
    match api_ok(info).map_err(failed)?.get("config") {
        Some(config @ Value::Object(_)) => Ok(config.clone()),
        _ => Err(failed("no stream configuration in the answer".into())),
    }
}

/// Switches per-message TTL on for `stream` when it is off. `Ok(true)`
/// when it was switched on now. Never switches it off (the server cannot).
pub(super) async fn ensure_msg_ttl(
    js: &jetstream::Context,
    stream: &str,
) -> Result<bool, JetStreamError> {
    let failed = |what: &str, why: String| {
        JetStreamError::Api(format!("{what} per-message TTL of stream {stream}: {why}"))
    };
    let mut config = stream_config(js, stream).await?;
    if config.get("allow_msg_ttl").and_then(Value::as_bool) == Some(true) {
        return Ok(false);
    }
    if let Some(fields) = config.as_object_mut() {
        fields.insert("allow_msg_ttl".into(), Value::Bool(true));
    }
    let updated: Value = js
        .request(format!("STREAM.UPDATE.{stream}"), &config)
        .await
        .map_err(|e| failed("switching on the", e.to_string()))?;
    api_ok(updated).map_err(|why| failed("switching on the", why))?;
    Ok(true)
}

/// Updates a stream whose per-message TTL is on to `update`, keeping it
/// on: the client's typed update would send it as off, which the server
/// refuses ("message TTL status can not be disabled").
pub(super) async fn update_keeping_msg_ttl(
    js: &jetstream::Context,
    update: &async_nats::jetstream::stream::Config,
) -> Result<(), String> {
    let mut body = serde_json::to_value(update).map_err(|e| e.to_string())?;
    if let Some(fields) = body.as_object_mut() {
        fields.insert("allow_msg_ttl".into(), Value::Bool(true));
    }
    let answer: Value = js
        .request(format!("STREAM.UPDATE.{}", update.name), &body)
        .await
        .map_err(|e| e.to_string())?;
    api_ok(answer).map(drop)
}

/// The answer, or the API error it carries.
fn api_ok(answer: Value) -> Result<Value, String> {
    match answer.get("error") {
        Some(error) => Err(error
            .get("description")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_string)),
        None => Ok(answer),
    }
}
