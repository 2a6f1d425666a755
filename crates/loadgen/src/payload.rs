//! Synthetic prefill results (contract 4.1), MessagePack with named fields,
//! shaped like what Dynamo's prefill workers emit for each backend.
//!
//! Every request ID carries the run and the message's sequence number, so an
//! output can be matched to its send instant without a lookup table.

use super::mix::Kind;
use rmpv::Value;

/// The request IDs of one run: `lg-{run}-{seq}` for measured messages and
/// `lg-{run}-w{seq}` for warm-up messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIds {
    prefix: String,
}

/// Which message of a run a request ID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Measured(usize),
    Warmup(usize),
}

impl RunIds {
    /// `run` must be a single NATS subject token (it also names the reply subject).
    pub fn new(run: &str) -> RunIds {
        RunIds {
            prefix: format!("lg-{run}-"),
        }
    }

    pub fn request_id(&self, tag: Tag) -> String {
        match tag {
            Tag::Measured(seq) => format!("{}{seq}", self.prefix),
            Tag::Warmup(seq) => format!("{}w{seq}", self.prefix),
        }
    }

    /// The message a request ID names, or `None` for IDs of other runs or
    /// other programs.
    pub fn parse(&self, request_id: &str) -> Option<Tag> {
        let rest = request_id.strip_prefix(&self.prefix)?;
        let (warmup, digits) = match rest.strip_prefix('w') {
            Some(d) => (true, d),
            None => (false, rest),
        };
        // `usize::from_str` accepts a leading '+'; our IDs never have one.
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let seq = digits.parse().ok()?;
        Some(if warmup {
            Tag::Warmup(seq)
        } else {
            Tag::Measured(seq)
        })
    }
}

/// What every message of a run shares.
#[derive(Debug, Clone)]
pub struct Template {
    /// The allowed reply subject outputs come back on.
    pub reply_to: String,
    /// A reply subject the worker must refuse (for [`Kind::Dead`]).
    pub refused_reply_to: String,
    /// Size of TensorRT-LLM's `opaque_state` (MessagePack binary).
    pub opaque_bytes: usize,
}

/// The encoded prefill result for one message. `nth` counts messages of the
/// same kind (it alternates the finish reason and the error flavour).
pub fn encode(template: &Template, kind: Kind, request_id: &str, seq: u64, nth: u64) -> Vec<u8> {
    to_msgpack(&build(template, kind, request_id, seq, nth))
}

/// [`encode`] as JSON, as a producer written in Python, Go or JavaScript
/// would send it: the same fields in the same order, binary data
/// (`opaque_state`) as base64.
pub fn encode_json(
    template: &Template,
    kind: Kind,
    request_id: &str,
    seq: u64,
    nth: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    write_json(&mut out, &build(template, kind, request_id, seq, nth));
    out
}

/// Appends a value as compact JSON, map entries in order: binary data as a
/// base64 string. Built only from what [`build`] writes (string keys, no
/// ext values, finite floats).
fn write_json(out: &mut Vec<u8>, value: &Value) {
    use base64::Engine as _;
    match value {
        Value::Nil | Value::Ext(..) => out.extend_from_slice(b"null"),
        Value::Boolean(b) => scalar(out, b),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => scalar(out, &u),
            (None, Some(n)) => scalar(out, &n),
            (None, None) => out.extend_from_slice(b"null"),
        },
        Value::F32(f) => scalar(out, &f64::from(*f)),
        Value::F64(f) => scalar(out, f),
        Value::String(s) => scalar(out, &s.as_str().unwrap_or_default()),
        Value::Binary(b) => scalar(out, &base64::engine::general_purpose::STANDARD.encode(b)),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(out, item);
            }
            out.push(b']');
        }
        Value::Map(entries) => {
            out.push(b'{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                scalar(out, &k.as_str().unwrap_or_default());
                out.push(b':');
                write_json(out, v);
            }
            out.push(b'}');
        }
    }
}

/// A scalar as serde_json writes it (its string escapes, its float form).
fn scalar<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// A value as MessagePack. `rmpv`'s writer, not the worker's own: the load
/// generator speaks the contract like any prefill worker would, so a fault
/// in the worker's codec cannot cancel out here.
pub fn to_msgpack(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    // Writing into a Vec cannot fail: `io::Write for Vec` never errors.
    rmpv::encode::write_value(&mut out, value).expect("writing to a Vec");
    out
}

/// A MessagePack map with string keys, in the order given.
pub fn from_pairs<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

fn build(template: &Template, kind: Kind, request_id: &str, seq: u64, nth: u64) -> Value {
    let token = Value::from(1000 + seq % 30000);
    let reply_to = match kind {
        Kind::Dead => template.refused_reply_to.as_str(),
        _ => template.reply_to.as_str(),
    };
    let (finish_reason, error, params) = match kind {
        Kind::Trtllm | Kind::Dead | Kind::Cancelled => {
            (Value::Nil, None, trtllm_params(template, seq, true))
        }
        Kind::Sglang => (Value::Nil, None, sglang_params(seq)),
        Kind::Vllm => (Value::Nil, None, vllm_params(seq)),
        Kind::Opaque => (
            Value::Nil,
            None,
            from_pairs([
                ("kv_handle", Value::from(format!("kv://pool-3/{seq:x}"))),
                ("node", Value::from(seq % 8)),
            ]),
        ),
        Kind::Terminal => {
            const REASONS: [&str; 4] = ["stop", "eos", "cancelled", "abort"];
            let reason = REASONS[(nth % REASONS.len() as u64) as usize];
            (
                Value::from(reason),
                None,
                trtllm_params(template, seq, true),
            )
        }
        Kind::Error if nth.is_multiple_of(2) => {
            (Value::Nil, None, trtllm_params(template, seq, false))
        }
        Kind::Error => (
            Value::from("error"),
            Some(Value::from(
                "prefill engine failed: CUDA error: out of memory",
            )),
            Value::Nil,
        ),
    };
    let mut frame = vec![
        (Value::from("token_ids"), Value::Array(vec![token.clone()])),
        (Value::from("text"), Value::from(" the")),
        (Value::from("finish_reason"), finish_reason),
        (
            Value::from("completion_usage"),
            from_pairs([
                ("prompt_tokens", Value::from(512)),
                ("completion_tokens", Value::from(1)),
                ("total_tokens", Value::from(513)),
            ]),
        ),
    ];
    if let Some(error) = error {
        frame.push((Value::from("error"), error));
    }
    if !params.is_nil() {
        frame.push((Value::from("disaggregated_params"), params));
    }
    from_pairs([
        ("request_id", Value::from(request_id)),
        ("reply_to", Value::from(reply_to)),
        ("frames", Value::Array(vec![Value::Map(frame)])),
        ("request", request(seq)),
    ])
}

/// TensorRT-LLM's context-only handoff, with the `disagg_request_id` its
/// producer took from the ID service before the context phase; without
/// `ctx_request_id` when `with_ctx_id` is false (the "ctx_request_id is
/// None" failure).
fn trtllm_params(template: &Template, seq: u64, with_ctx_id: bool) -> Value {
    let ctx = if with_ctx_id {
        Value::from(1_000_000 + seq)
    } else {
        Value::Nil
    };
    from_pairs([
        ("request_type", Value::from("context_only")),
        ("disagg_request_id", Value::from((1u64 << 40) + seq)),
        (
            "first_gen_tokens",
            Value::Array(vec![Value::from(1000 + seq % 30000)]),
        ),
        ("ctx_request_id", ctx),
        (
            "opaque_state",
            Value::Binary(noise(seq, template.opaque_bytes)),
        ),
        ("draft_tokens", Value::Nil),
    ])
}

fn sglang_params(seq: u64) -> Value {
    from_pairs([
        ("bootstrap_host", Value::from("10.0.0.7")),
        ("bootstrap_port", Value::from(8998)),
        ("bootstrap_room", Value::from(seq)),
    ])
}

fn vllm_params(seq: u64) -> Value {
    from_pairs([
        ("do_remote_prefill", Value::from(true)),
        ("remote_engine_id", Value::from("prefill-engine-0")),
        (
            "remote_block_ids",
            Value::Array((0..16).map(|i| Value::from(seq * 16 + i)).collect()),
        ),
        ("remote_host", Value::from("10.0.0.8")),
        ("remote_port", Value::from(5600)),
    ])
}

/// The original request as a dispatcher would pass it on: model, a short
/// tokenized prompt and sampling options.
fn request(seq: u64) -> Value {
    from_pairs([
        ("model", Value::from("meta-llama/Llama-3.1-8B-Instruct")),
        (
            "token_ids",
            Value::Array(
                (0..32)
                    .map(|i| Value::from((seq + i * 7919) % 128_000))
                    .collect(),
            ),
        ),
        (
            "sampling_options",
            from_pairs([
                ("temperature", Value::F64(0.7)),
                ("top_p", Value::F64(0.95)),
            ]),
        ),
        (
            "stop_conditions",
            from_pairs([("max_tokens", Value::from(256))]),
        ),
    ])
}

/// Deterministic bytes that do not compress (xorshift), like a real handle.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value under a string key of a map.
    fn get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
        map.iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    #[test]
    fn request_ids_round_trip_and_foreign_ids_are_refused() {
        let ids = RunIds::new("ab12");
        for tag in [Tag::Measured(0), Tag::Measured(99_999), Tag::Warmup(7)] {
            assert_eq!(ids.parse(&ids.request_id(tag)), Some(tag));
        }
        for foreign in [
            "lg-ab13-5",
            "lg-ab12-",
            "lg-ab12-w",
            "lg-ab12-+5",
            "lg-ab12-5x",
            "lg-ab12-x5",
            "5",
            "",
            "lg-ab12-99999999999999999999999",
        ] {
            assert_eq!(ids.parse(foreign), None, "{foreign:?}");
        }
    }

    fn decoded(kind: Kind, nth: u64) -> Vec<(Value, Value)> {
        let template = Template {
            reply_to: "llm.replies.loadgen.r".into(),
            refused_reply_to: "$SYS.loadgen".into(),
            opaque_bytes: 256,
        };
        let bytes = encode(&template, kind, "lg-r-3", 3, nth);
        match rmpv::decode::read_value(&mut bytes.as_slice()) {
            Ok(Value::Map(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    fn first_frame(top: &[(Value, Value)]) -> Vec<(Value, Value)> {
        match get(top, "frames") {
            Some(Value::Array(frames)) => match &frames[0] {
                Value::Map(m) => m.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn trtllm_handoff_has_binary_opaque_state_of_the_asked_size() {
        let top = decoded(Kind::Trtllm, 0);
        assert_eq!(get(&top, "request_id"), Some(&Value::from("lg-r-3")));
        let frame = first_frame(&top);
        assert_eq!(get(&frame, "finish_reason"), Some(&Value::Nil));
        let Some(Value::Map(params)) = get(&frame, "disaggregated_params") else {
            panic!("no params")
        };
        match get(params, "opaque_state") {
            Some(Value::Binary(b)) => assert_eq!(b.len(), 256),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            get(params, "ctx_request_id"),
            Some(&Value::from(1_000_003u64))
        );
    }

    #[test]
    fn each_kind_carries_what_the_decision_reads() {
        // (kind, nth, finish_reason, has error, ctx_request_id present, reply_to)
        type Row = (Kind, u64, Value, bool, Option<bool>, &'static str);
        let reply = "llm.replies.loadgen.r";
        let rows: [Row; 6] = [
            (
                Kind::Terminal,
                0,
                Value::from("stop"),
                false,
                Some(true),
                reply,
            ),
            (
                Kind::Terminal,
                1,
                Value::from("eos"),
                false,
                Some(true),
                reply,
            ),
            (Kind::Error, 0, Value::Nil, false, Some(false), reply),
            (Kind::Error, 1, Value::from("error"), true, None, reply),
            (Kind::Dead, 0, Value::Nil, false, Some(true), "$SYS.loadgen"),
            (Kind::Sglang, 0, Value::Nil, false, None, reply),
        ];
        for (kind, nth, reason, has_error, ctx, reply_to) in rows {
            let top = decoded(kind, nth);
            let frame = first_frame(&top);
            let label = format!("{} #{nth}", kind.as_str());
            assert_eq!(
                get(&top, "reply_to"),
                Some(&Value::from(reply_to)),
                "{label}"
            );
            assert_eq!(get(&frame, "finish_reason"), Some(&reason), "{label}");
            assert_eq!(get(&frame, "error").is_some(), has_error, "{label}");
            let ctx_present = match get(&frame, "disaggregated_params") {
                Some(Value::Map(p)) if get(p, "ctx_request_id").is_some() => {
                    Some(get(p, "ctx_request_id").is_some_and(|v| !v.is_nil()))
                }
                _ => None,
            };
            assert_eq!(ctx_present, ctx, "{label}");
        }
    }
}
