//! Prefill results to publish, and reading request IDs back from outputs.

use super::PREFILL;
use crate::common::messages;
use async_nats::{HeaderMap, jetstream};
use prefill_handoff::wire::{self, Encoding};
use serde_json::{Value as Json, json};
use tokio::task::JoinHandle;

/// Where an input's one output must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expect {
    Gen,
    Reply,
    Dead,
}

/// One prefill result to publish.
#[derive(Debug, Clone)]
pub struct Input {
    pub request_id: String,
    pub payload: Vec<u8>,
    pub json: bool,
    pub expect: Expect,
}

/// Poison: starts with 0xc1, a byte MessagePack never uses, and is not JSON.
pub fn poison(request_id: &str) -> Vec<u8> {
    let mut bytes = vec![0xc1, 0x00];
    bytes.extend_from_slice(format!("poison:{request_id}").as_bytes());
    bytes
}

fn encode(value: &Json, json: bool) -> Vec<u8> {
    let bytes = serde_json::to_vec(value).expect("json");
    if json {
        return bytes;
    }
    let tree = wire::decode(&bytes, Encoding::Json).expect("valid json");
    wire::encode(&tree, Encoding::MsgPack)
}

fn frame(finish_reason: Json, params: Option<Json>) -> Json {
    let mut frame = json!({"token_ids": [42], "text": "x", "finish_reason": finish_reason});
    if let Some(p) = params {
        frame["disaggregated_params"] = p;
    }
    frame
}

/// Input number `i` of a mixed run: every backend, terminal results, error
/// results, and dead letters (hostile reply subjects, poison bytes).
pub fn mixed(i: usize) -> Input {
    let request_id = format!("req-{i:06}");
    let reply_to = format!("llm.replies.{i}");
    let json = i.is_multiple_of(7);
    let result =
        |frames: Json| json!({"request_id": request_id, "reply_to": reply_to, "frames": frames});
    let (value, expect) = match i % 10 {
        0 | 1 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"ctx_request_id": i, "request_type": "context_only"}))
            )])),
            Expect::Gen,
        ),
        2 => (
            result(json!([frame(
                json!("length"),
                Some(
                    json!({"ctx_request_id": i, "disagg_request_id": 1_099_511_627_776u64 + i as u64})
                )
            )])),
            Expect::Gen,
        ),
        3 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": i}))
            )])),
            Expect::Gen,
        ),
        4 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"remote_engine_id": "e", "remote_block_ids": [1, 2]}))
            )])),
            Expect::Gen,
        ),
        5 => (result(json!([frame(json!("eos"), None)])), Expect::Reply),
        6 => (
            result(json!([
                frame(json!("stop"), None),
                frame(json!("length"), None)
            ])),
            Expect::Reply,
        ),
        7 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"request_type": "context_only"}))
            )])),
            Expect::Reply,
        ),
        8 => (
            result(json!([{"error": "CUDA out of memory"}])),
            Expect::Reply,
        ),
        _ => {
            if i % 20 == 9 {
                return Input {
                    payload: poison(&request_id),
                    request_id,
                    json: false,
                    expect: Expect::Dead,
                };
            }
            (
                json!({"request_id": request_id, "reply_to": "$JS.API.STREAM.DELETE.LLM_GEN", "frames": [frame(json!("eos"), None)]}),
                Expect::Dead,
            )
        }
    };
    Input {
        payload: encode(&value, json),
        request_id,
        json,
        expect,
    }
}

/// A TensorRT-LLM result that needs a freshly minted `disagg_request_id`.
pub fn needs_mint(request_id: &str) -> Input {
    let value = json!({
        "request_id": request_id,
        "reply_to": format!("llm.replies.{request_id}"),
        "frames": [frame(Json::Null, Some(json!({"ctx_request_id": 7, "request_type": "context_only"})))],
    });
    Input {
        payload: encode(&value, false),
        request_id: request_id.into(),
        json: false,
        expect: Expect::Gen,
    }
}

impl Input {
    /// The headers its producer sends: a JSON result says so.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if self.json {
            headers.insert("Content-Type", "application/json");
        }
        headers
    }

    /// A terminal result ([`messages::terminal`]): needs no ID.
    pub fn terminal(request_id: &str) -> Input {
        Input {
            payload: encode(&messages::terminal(request_id), false),
            request_id: request_id.into(),
            json: false,
            expect: Expect::Reply,
        }
    }
}

/// [`publish_all`] in a task of its own, so that the test can act on the
/// run meanwhile.
pub fn publish_in_background(js: &jetstream::Context, inputs: &[Input]) -> JoinHandle<()> {
    let (js, inputs) = (js.clone(), inputs.to_vec());
    tokio::spawn(async move { publish_all(&js, &inputs).await })
}

/// Publishes every input into the prefill stream and waits for the stream's acks.
pub async fn publish_all(js: &jetstream::Context, inputs: &[Input]) {
    for chunk in inputs.chunks(500) {
        let mut acks = Vec::with_capacity(chunk.len());
        for input in chunk {
            let mut headers = input.headers();
            headers.insert("traceparent", format!("00-{:032x}-00f067aa0ba902b7-01", 1));
            let ack = js
                .publish_with_headers(PREFILL, headers, input.payload.clone().into())
                .await
                .expect("publish into the prefill stream");
            acks.push(ack);
        }
        for ack in acks {
            ack.await.expect("prefill stream stored the result");
        }
    }
}

/// The request ID an output belongs to: from its body, or from the poison bytes.
pub fn request_id_of(payload: &[u8], headers: Option<&HeaderMap>) -> String {
    if payload.is_empty() {
        // A dead letter sent without the input's bytes (they did not fit).
        return "<bytes omitted>".to_string();
    }
    if let Some(rest) = payload.strip_prefix(&[0xc1, 0x00][..]) {
        return String::from_utf8_lossy(rest)
            .trim_start_matches("poison:")
            .to_string();
    }
    let json = headers
        .and_then(|h| h.get("Content-Type"))
        .is_some_and(|v| v.as_str() == "application/json");
    let encoding = if json {
        Encoding::Json
    } else {
        Encoding::MsgPack
    };
    // Dead letters of JSON inputs carry no Content-Type: try both.
    let value = wire::decode(payload, encoding)
        .or_else(|_| wire::decode(payload, Encoding::Json))
        .unwrap_or_else(|e| {
            panic!(
                "undecodable output {e}: {:?} {headers:?}",
                String::from_utf8_lossy(payload)
            )
        });
    field(&value, "request_id")
        .and_then(|v| v.as_str())
        .unwrap_or("<none>")
        .to_string()
}

pub fn field<'a>(value: &'a rmpv::Value, key: &str) -> Option<&'a rmpv::Value> {
    value
        .as_map()
        .and_then(|m| prefill_handoff::wire::map::get(m, key))
}
