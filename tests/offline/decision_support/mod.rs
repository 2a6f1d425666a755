//! Helpers shared by the decision tests: building prefill results, running
//! [`decide`] on them with the default configuration, and checking outcomes.
//!
//! No network: the decision is pure. The only stand-in is [`TestIds`], a
//! deterministic ID source, so tests can name the minted ID exactly; tests
//! that need the real one use `Identity::fixed` or a fenced `Identity::new`.

pub mod invariants;

use prefill_handoff::config::{Config, MissingDisaggRequestId};
use prefill_handoff::decision::{
    Backend, DeadLetterCode, Decision, ErrorCode, FinishReason, IdSource, IdentityUnavailable,
    Input, InstanceId, Outcome, Rules, decide,
};
use prefill_handoff::ids::MachineId;
use prefill_handoff::wire::{self, Encoding, map};
use rmpv::Value;
use serde_json::{Value as Json, json};

/// An allowed reply subject (`_INBOX.>`).
pub const REPLY: &str = "_INBOX.client.1";
/// The subject results arrive on.
pub const SOURCE: &str = "llm.prefill.results";
pub const GEN: &str = "llm.gen.jobs";
pub const DEAD: &str = "llm.handoff.dead";
/// The first ID [`TestIds`] mints.
pub const FIRST_MINTED: u64 = 1_000_000;

/// The rules of the default configuration: core mode (the NATS reply subject
/// is the fallback when `reply_to` is absent), but for a TensorRT-LLM
/// handoff without `disagg_request_id`, which the worker mints
/// (`trtllm.missing_disagg_request_id = "mint"`): most tables here check the
/// minted ID. [`default_rules`] are the configuration's own.
pub fn rules() -> Rules {
    Rules {
        missing_disagg_request_id: MissingDisaggRequestId::Mint,
        ..default_rules()
    }
}

/// The rules of the default configuration as it is.
pub fn default_rules() -> Rules {
    Config::default()
        .resolve()
        .map(|c| Rules::from_config(&c).expect("rules"))
        .expect("the default configuration is valid")
}

/// The rules in JetStream mode: the reply subject must be in the body.
pub fn jetstream_rules() -> Rules {
    Rules {
        use_nats_reply: false,
        ..rules()
    }
}

/// A deterministic ID source: mints `FIRST_MINTED`, `FIRST_MINTED + 1`, ...
/// from slot 17, or refuses when fenced.
#[derive(Debug, Clone)]
pub struct TestIds {
    pub next: u64,
    pub slot: Option<MachineId>,
    pub minted: usize,
}

impl TestIds {
    pub fn holding_slot() -> TestIds {
        TestIds {
            next: FIRST_MINTED,
            slot: Some(MachineId::new(17).expect("17 is a slot")),
            minted: 0,
        }
    }

    pub fn fenced() -> TestIds {
        TestIds {
            slot: None,
            ..TestIds::holding_slot()
        }
    }
}

impl IdSource for TestIds {
    fn instance_id(&self) -> InstanceId {
        InstanceId::of(0xab)
    }

    fn machine_id(&self) -> Option<MachineId> {
        self.slot
    }

    fn mint(&mut self) -> Result<u64, IdentityUnavailable> {
        if self.slot.is_none() {
            return Err(IdentityUnavailable("fenced".into()));
        }
        self.minted += 1;
        self.next += 1;
        Ok(self.next - 1)
    }
}

/// A JSON value as a MessagePack value tree.
pub fn v(j: Json) -> Value {
    rmpv::ext::to_value(j).expect("JSON converts to MessagePack")
}

pub fn msgpack(value: &Value) -> Vec<u8> {
    wire::encode(value, Encoding::MsgPack)
}

/// A prefill result with the default request ID and reply subject.
pub fn result(frames: Json) -> Json {
    json!({"request_id": "req-1", "reply_to": REPLY, "frames": frames})
}

/// A first frame: `finish_reason` and `disaggregated_params` left out when `None`.
pub fn frame(finish_reason: Option<Json>, params: Option<Json>) -> Json {
    let mut f = json!({"token_ids": [42], "text": "Hi", "completion_usage": {"prompt_tokens": 5}});
    if let Some(reason) = finish_reason {
        f["finish_reason"] = reason;
    }
    if let Some(params) = params {
        f["disaggregated_params"] = params;
    }
    f
}

/// TensorRT-LLM context-phase params, as the engine returns them.
pub fn trt() -> Json {
    json!({
        "ctx_request_id": 7,
        "request_type": "context_only",
        "opaque_state": [1, 2, 3],
        "first_gen_tokens": [42],
        "draft_tokens": null,
    })
}

pub fn sglang() -> Json {
    json!({"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 12345})
}

pub fn vllm() -> Json {
    json!({
        "do_remote_prefill": true,
        "remote_engine_id": "engine-a",
        "remote_block_ids": [0, 1, 2],
        "remote_host": "10.0.0.6",
        "remote_port": 5600,
    })
}

/// `j` with `key` set to `value`.
pub fn with(mut j: Json, key: &str, value: Json) -> Json {
    j[key] = value;
    j
}

/// `j` without `key`.
pub fn without(mut j: Json, key: &str) -> Json {
    if let Some(m) = j.as_object_mut() {
        m.remove(key);
    }
    j
}

/// A result whose first frame has `finish_reason: "length"` and these params.
pub fn needs_decode(params: Json) -> Json {
    result(json!([frame(Some(json!("length")), Some(params))]))
}

/// Decides a MessagePack message with the default rules and [`TestIds`].
pub fn decide_msgpack(message: &Value) -> Decision {
    decide_bytes(&msgpack(message), Encoding::MsgPack, &rules(), None)
}

/// Decides a JSON-built message sent as MessagePack.
pub fn decide_json_as_msgpack(message: Json) -> Decision {
    decide_msgpack(&v(message))
}

pub fn decide_bytes(
    payload: &[u8],
    encoding: Encoding,
    rules: &Rules,
    nats_reply: Option<&str>,
) -> Decision {
    let input = Input {
        nats_reply,
        ..input(payload, encoding)
    };
    decide(input, rules, &mut TestIds::holding_slot())
}

/// A result's input on [`SOURCE`] at time 0: no NATS reply subject, no
/// deadline or KV expiry header, nothing cancelled. Tests set what they vary
/// with struct update syntax (`Input { now_ms: NOW, ..input(p, e) }`).
pub fn input(payload: &[u8], encoding: Encoding) -> Input<'_> {
    Input {
        payload,
        encoding,
        subject: SOURCE,
        nats_reply: None,
        deadline_header: None,
        kv_expires_header: None,
        now_ms: 0,
        published_ms: 0,
        cancels: prefill_handoff::decision::NO_CANCELS,
    }
}

/// The published body as a value tree.
pub fn body(d: &Decision, encoding: Encoding) -> Value {
    wire::decode(&d.payload, encoding).expect("the worker publishes what it can read")
}

pub fn header<'a>(d: &'a Decision, name: &str) -> Option<&'a str> {
    d.headers.get(name)
}

/// A string field of a map value.
pub fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    match value {
        Value::Map(m) => map::get(m, key),
        _ => None,
    }
}

pub fn path<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(value, |v, k| field(v, k))
}

/// What a row of a table expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Terminal(FinishReason),
    Decode(Backend),
    Error(ErrorCode),
    Dead(DeadLetterCode),
}

/// Checks the outcome, the subject and the body's shape of a MessagePack
/// decision against a row's expectation.
pub fn check(name: &str, d: &Decision, expect: Expect) {
    let b = || body(d, Encoding::MsgPack);
    match expect {
        Expect::Terminal(reason) => {
            assert_eq!(
                d.outcome,
                Outcome::Terminal {
                    finish_reason: reason
                },
                "{name}: {:?}",
                d.detail
            );
            assert_eq!(&*d.subject, REPLY, "{name}");
            let b = b();
            assert_eq!(field(&b, "kind").and_then(Value::as_str), Some("terminal"));
            assert_eq!(
                field(&b, "request_id").and_then(Value::as_str),
                Some("req-1")
            );
            let output = field(&b, "output").expect("terminal output");
            assert!(
                field(output, "disaggregated_params").is_none(),
                "{name}: params must be stripped from a terminal output"
            );
        }
        Expect::Decode(backend) => {
            assert!(
                matches!(d.outcome, Outcome::Decode { backend: b, .. } if b == backend),
                "{name}: expected decode/{backend}, got {:?} ({:?})",
                d.outcome,
                d.detail
            );
            assert_eq!(&*d.subject, GEN, "{name}");
            let b = b();
            assert_eq!(
                field(&b, "backend").and_then(Value::as_str),
                Some(backend.as_str())
            );
            assert_eq!(header(d, "Nats-Msg-Id"), Some("handoff-req-1"), "{name}");
        }
        Expect::Error(code) => {
            assert_eq!(d.outcome, Outcome::Error { code }, "{name}: {:?}", d.detail);
            assert_eq!(&*d.subject, REPLY, "{name}");
            let b = b();
            assert_eq!(field(&b, "kind").and_then(Value::as_str), Some("error"));
            assert_eq!(
                path(&b, &["error", "code"]).and_then(Value::as_str),
                Some(code.as_str()),
                "{name}"
            );
            let message = path(&b, &["error", "message"]).and_then(Value::as_str);
            assert!(
                message.is_some_and(|m| m.len() > 10),
                "{name}: an error carries a sentence"
            );
        }
        Expect::Dead(code) => {
            assert_eq!(
                d.outcome,
                Outcome::DeadLetter { code },
                "{name}: {:?}",
                d.detail
            );
            assert_eq!(&*d.subject, DEAD, "{name}");
            assert_eq!(
                header(d, "Handoff-Error-Code"),
                Some(code.as_str()),
                "{name}"
            );
            assert!(header(d, "Handoff-Error").is_some_and(|m| !m.is_empty()));
            assert_eq!(header(d, "Handoff-Source-Subject"), Some(SOURCE));
        }
    }
}
