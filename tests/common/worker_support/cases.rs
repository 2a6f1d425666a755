//! A catalogue of prefill results, one per rule of contract 4.2, each with the
//! output contract 4.3 requires, and a checker that matches outputs to inputs.

use super::{DEAD, GEN, PREFILL};
use crate::common::messages::{decode_output, header, msgpack};
use async_nats::Message;
use prefill_handoff::ids::IdLayout;
use serde_json::{Value, json};
use std::collections::HashMap;

/// The output a case must produce.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// A decode job on GEN. `kept`: the disagg_request_id that must be kept;
    /// `None` for TensorRT-LLM means one must be minted.
    Decode {
        backend: &'static str,
        kept: Option<u64>,
    },
    Terminal,
    Error(&'static str),
    Dead(&'static str),
}

#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub request_id: String,
    /// Where replies for this case go (the body's reply_to or the NATS reply).
    pub reply: String,
    /// Set as the NATS message's reply subject.
    pub nats_reply: Option<String>,
    pub body: Vec<u8>,
    pub json: bool,
    pub expect: Expect,
}

fn frame(finish_reason: Value, params: Option<Value>) -> Value {
    let mut frame = json!({
        "token_ids": [101, 102],
        "text": "Hello",
        "finish_reason": finish_reason,
        "completion_usage": {"prompt_tokens": 12, "completion_tokens": 1},
        "engine_extra": {"kept": true},
    });
    if let Some(params) = params {
        frame["disaggregated_params"] = params;
    }
    frame
}

/// Builds a case from its name, frames and expectation.
struct Builder<'a> {
    tag: &'a str,
    cases: Vec<Case>,
}

impl Builder<'_> {
    fn add(&mut self, name: &'static str, frames: Value, expect: Expect) {
        let request_id = format!("{}-{name}", self.tag);
        let reply = format!("llm.replies.{}.{name}", self.tag);
        let body = json!({
            "request_id": request_id,
            "reply_to": reply,
            "frames": frames,
            "request": {"model": "m", "max_tokens": 16, "upstream_new_field": [1, "x"]},
        });
        self.push(name, request_id, reply, None, msgpack(&body), expect);
    }

    fn push(
        &mut self,
        name: &'static str,
        request_id: String,
        reply: String,
        nats_reply: Option<String>,
        body: Vec<u8>,
        expect: Expect,
    ) {
        self.cases.push(Case {
            name,
            request_id,
            reply,
            nats_reply,
            body,
            json: false,
            expect,
        });
    }
}

/// One prefill result per rule, all in MessagePack, with request IDs and
/// reply subjects unique to `tag`.
pub fn mixed(tag: &str) -> Vec<Case> {
    let mut b = Builder {
        tag,
        cases: Vec::new(),
    };
    let go = Value::Null;
    let trt = |extra: Value| {
        let mut p = json!({"ctx_request_id": 7, "request_type": "context_only", "opaque_state": "c3RhdGU=", "first_gen_tokens": [102]});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    use Expect::*;
    b.add(
        "trtllm-mint",
        json!([frame(go.clone(), Some(trt(json!({}))))]),
        Decode {
            backend: "trtllm",
            kept: None,
        },
    );
    b.add(
        "trtllm-keep",
        json!([frame(
            json!("length"),
            Some(trt(json!({"disagg_request_id": 1234567})))
        )]),
        Decode {
            backend: "trtllm",
            kept: Some(1234567),
        },
    );
    b.add(
        "sglang",
        json!([frame(
            go.clone(),
            Some(
                json!({"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 42})
            )
        )]),
        Decode {
            backend: "sglang",
            kept: None,
        },
    );
    b.add(
        "vllm",
        json!([frame(json!("not_finished"), Some(json!({"do_remote_prefill": true, "remote_engine_id": "e-1", "remote_block_ids": [1, 2, 3], "remote_port": 5600})))]),
        Decode { backend: "vllm", kept: None },
    );
    b.add(
        "opaque",
        json!([frame(go.clone(), Some(json!({"kv_handle": "abc"})))]),
        Decode {
            backend: "opaque",
            kept: None,
        },
    );
    b.add(
        "eos",
        json!([frame(json!("eos"), Some(trt(json!({}))))]),
        Terminal,
    );
    b.add(
        "unknown-reason",
        json!([frame(json!("made_up"), None)]),
        Terminal,
    );
    b.add(
        "error-reason",
        json!([frame(json!({"error": "oom"}), None)]),
        Terminal,
    );
    b.add(
        "trailing-error-ignored",
        json!([frame(json!("stop"), None), {"error": "late"}, frame(go.clone(), None)]),
        Terminal,
    );
    b.add("no-output", json!([]), Error("no_output"));
    b.add(
        "prefill-failed",
        json!([{"error": "CUDA error"}]),
        Error("prefill_failed"),
    );
    b.add(
        "no-params",
        json!([frame(go.clone(), None)]),
        Error("no_disaggregated_params"),
    );
    b.add(
        "missing-ctx",
        json!([frame(
            go.clone(),
            Some(json!({"request_type": "context_only"}))
        )]),
        Error("missing_ctx_request_id"),
    );
    b.add(
        "invalid-ctx",
        json!([frame(go.clone(), Some(trt(json!({"ctx_request_id": -1}))))]),
        Error("invalid_ctx_request_id"),
    );
    b.add(
        "invalid-type",
        json!([frame(
            go.clone(),
            Some(trt(json!({"request_type": "generation_only"})))
        )]),
        Error("invalid_request_type"),
    );
    b.add(
        "invalid-disagg",
        json!([frame(
            go.clone(),
            Some(trt(json!({"disagg_request_id": 0})))
        )]),
        Error("invalid_disagg_request_id"),
    );
    b.add(
        "invalid-bootstrap",
        json!([frame(
            go.clone(),
            Some(json!({"bootstrap_host": "", "bootstrap_port": 8998, "bootstrap_room": 1}))
        )]),
        Error("invalid_bootstrap"),
    );
    b.add(
        "invalid-kv",
        json!([frame(
            go.clone(),
            Some(json!({"remote_engine_id": "e", "remote_block_ids": [-1]}))
        )]),
        Error("invalid_kv_transfer_params"),
    );
    // Well-formed reply subject, but no request_id: an error to the reply subject.
    let reply = format!("llm.replies.{tag}.malformed-error");
    let body = msgpack(&json!({"reply_to": reply, "frames": [frame(json!("eos"), None)]}));
    b.push(
        "malformed-error",
        String::new(),
        reply,
        None,
        body,
        Error("malformed"),
    );
    // No reply_to in the body: core mode answers the NATS reply subject.
    let request_id = format!("{tag}-nats-reply");
    let reply = format!("_INBOX.{tag}.nats-reply");
    let body = msgpack(&json!({"request_id": request_id, "frames": [frame(json!("stop"), None)]}));
    b.push(
        "nats-reply",
        request_id,
        reply.clone(),
        Some(reply),
        body,
        Terminal,
    );
    // Not MessagePack at all.
    let mut garbage = vec![0xc1, 0x00];
    garbage.extend_from_slice(tag.as_bytes());
    b.push(
        "garbage",
        String::new(),
        String::new(),
        None,
        garbage,
        Dead("malformed"),
    );
    let body = msgpack(&json!({"request_id": format!("{tag}-no-reply"), "frames": []}));
    b.push(
        "no-reply",
        String::new(),
        String::new(),
        None,
        body,
        Dead("missing_reply_to"),
    );
    let body = msgpack(
        &json!({"request_id": format!("{tag}-evil"), "reply_to": "elsewhere.subject", "frames": []}),
    );
    b.push(
        "not-allowed",
        String::new(),
        String::new(),
        None,
        body,
        Dead("reply_to_not_allowed"),
    );
    b.cases
}

/// Publishes every case on the prefill subject.
pub async fn publish(client: &async_nats::Client, cases: &[Case]) {
    for case in cases {
        let payload = bytes::Bytes::from(case.body.clone());
        let mut headers = async_nats::HeaderMap::new();
        if case.json {
            headers.insert("Content-Type", "application/json");
        }
        let result = match &case.nats_reply {
            Some(reply) => {
                client
                    .publish_with_reply_and_headers(PREFILL, reply.clone(), headers, payload)
                    .await
            }
            None => client.publish_with_headers(PREFILL, headers, payload).await,
        };
        result.expect("publish");
    }
    client.flush().await.expect("flush");
}

/// Which case an output belongs to.
fn owner<'a>(cases: &'a [Case], message: &Message) -> Option<&'a Case> {
    match message.subject.as_str() {
        DEAD => cases.iter().find(|c| c.body == message.payload.as_ref()),
        GEN => {
            let job = decode_output(message);
            cases
                .iter()
                .find(|c| job["request_id"] == c.request_id.as_str())
        }
        subject => cases.iter().find(|c| c.reply == subject),
    }
}

/// Checks that every case has exactly one output, on the right subject, with
/// the fields of contract 4.3, and that nothing else was published. Returns
/// the machine IDs named by decode jobs.
pub fn check(cases: &[Case], outputs: &[Message]) -> Vec<Option<u64>> {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let mut machine_ids = Vec::new();
    for message in outputs {
        let case = owner(cases, message)
            .unwrap_or_else(|| panic!("an output on {:?} belongs to no input", message.subject));
        let index = cases
            .iter()
            .position(|c| std::ptr::eq(c, case))
            .unwrap_or(usize::MAX);
        *seen.entry(index).or_default() += 1;
        if let Some(m) = check_one(case, message) {
            machine_ids.push(m);
        }
    }
    for (index, case) in cases.iter().enumerate() {
        assert_eq!(
            seen.get(&index).copied().unwrap_or(0),
            1,
            "case {} ({}) must have exactly one output",
            case.name,
            case.request_id
        );
    }
    assert_eq!(
        outputs.len(),
        cases.len(),
        "one output per input, nothing else"
    );
    machine_ids
}

/// Checks one output against its case; for decode jobs returns worker.machine_id.
fn check_one(case: &Case, message: &Message) -> Option<Option<u64>> {
    let headers = message.headers.as_ref();
    let content_type = header(headers, "Content-Type");
    let name = case.name;
    if let Expect::Dead(code) = &case.expect {
        assert_eq!(message.subject.as_str(), DEAD, "{name}");
        assert_eq!(
            message.payload.as_ref(),
            case.body.as_slice(),
            "{name}: original bytes"
        );
        assert_eq!(header(headers, "Handoff-Error-Code"), Some(*code), "{name}");
        assert!(
            header(headers, "Handoff-Error").is_some_and(|s| !s.is_empty()),
            "{name}"
        );
        assert_eq!(
            header(headers, "Handoff-Source-Subject"),
            Some(PREFILL),
            "{name}"
        );
        return None;
    }
    assert_eq!(
        content_type,
        case.json.then_some("application/json"),
        "{name}: output encoding"
    );
    let out = decode_output(message);
    let keys: Vec<&str> = out
        .as_object()
        .expect("a map")
        .keys()
        .map(String::as_str)
        .collect();
    match &case.expect {
        Expect::Decode { backend, kept } => {
            assert_eq!(message.subject.as_str(), GEN, "{name}");
            assert_eq!(
                header(headers, "Nats-Msg-Id"),
                Some(format!("handoff-{}", case.request_id).as_str()),
                "{name}"
            );
            assert_eq!(out["request_id"], case.request_id.as_str(), "{name}");
            assert_eq!(out["reply_to"], case.reply.as_str(), "{name}");
            assert_eq!(out["backend"], *backend, "{name}");
            assert_eq!(
                out["request"]["upstream_new_field"],
                json!([1, "x"]),
                "{name}: request passed on"
            );
            let output = &out["prefill_output"];
            assert!(output.get("disaggregated_params").is_none(), "{name}");
            assert_eq!(output["token_ids"], json!([101, 102]), "{name}");
            assert_eq!(
                output["engine_extra"],
                json!({"kept": true}),
                "{name}: unknown fields kept"
            );
            let worker = &out["worker"];
            assert!(
                worker["instance_id"]
                    .as_str()
                    .is_some_and(|s| s.len() == 16),
                "{name}"
            );
            let handoff = &out["handoff"];
            if *backend == "trtllm" {
                let id = out["disagg_request_id"]
                    .as_u64()
                    .expect("disagg_request_id");
                assert_eq!(handoff["disagg_request_id"].as_u64(), Some(id), "{name}");
                assert_eq!(handoff["request_type"], "generation_only", "{name}");
                assert_eq!(
                    handoff["opaque_state"], "c3RhdGU=",
                    "{name}: other keys kept"
                );
                match kept {
                    Some(kept) => assert_eq!(id, *kept, "{name}: the CTX ID is kept"),
                    None => {
                        let decoded = IdLayout::Rc22.decode(id).expect("a valid rc22 ID");
                        assert_eq!(
                            Some(u64::from(decoded.machine_id)),
                            worker["machine_id"].as_u64(),
                            "{name}: minted with the worker's slot"
                        );
                    }
                }
            } else {
                assert!(out.get("disagg_request_id").is_none(), "{name}");
                assert!(!keys.contains(&"disagg_request_id"), "{name}");
            }
            for key in &keys {
                assert!(
                    [
                        "request_id",
                        "reply_to",
                        "backend",
                        "disagg_request_id",
                        "handoff",
                        "prefill_output",
                        "request",
                        "worker"
                    ]
                    .contains(key),
                    "{name}: unexpected key {key}"
                );
            }
            return Some(worker["machine_id"].as_u64());
        }
        Expect::Terminal => {
            assert_eq!(message.subject.as_str(), case.reply, "{name}");
            assert_eq!(keys.len(), 3, "{name}: {keys:?}");
            assert_eq!(out["request_id"], case.request_id.as_str(), "{name}");
            assert_eq!(out["kind"], "terminal", "{name}");
            assert!(
                out["output"].get("disaggregated_params").is_none(),
                "{name}"
            );
            assert_eq!(out["output"]["text"], "Hello", "{name}");
        }
        Expect::Error(code) => {
            assert_eq!(message.subject.as_str(), case.reply, "{name}");
            assert_eq!(keys.len(), 3, "{name}: {keys:?}");
            if !case.request_id.is_empty() {
                assert_eq!(out["request_id"], case.request_id.as_str(), "{name}");
            }
            assert_eq!(out["kind"], "error", "{name}");
            assert_eq!(out["error"]["code"], *code, "{name}");
            assert!(
                out["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.len() > 10),
                "{name}"
            );
        }
        Expect::Dead(_) => unreachable!(),
    }
    None
}
