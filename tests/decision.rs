//! The decision, rule by rule (contract 4.2): one table row per case, in the
//! contract's order. Backend validation is in `decision_handoff.rs`, dead
//! letters and reply subjects in `decision_dead_letter.rs`.

mod decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, ErrorCode, FinishReason, Outcome};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

fn row(name: &'static str, message: Json, expect: Expect) -> (&'static str, Json, Expect) {
    (name, message, expect)
}

#[test]
fn the_first_frame_decides() {
    use Expect::*;
    let t = Some(trt());
    let rows = vec![
        // Rule 1: no frames.
        row(
            "frames empty",
            result(json!([])),
            Error(ErrorCode::NoOutput),
        ),
        // Rule 2: the first frame is an error event.
        row(
            "first frame has error (string)",
            result(json!([{"error": "CUDA out of memory"}])),
            Error(ErrorCode::PrefillFailed),
        ),
        row(
            "first frame has error (map)",
            result(json!([{"error": {"message": "engine died", "type": "EngineError"}}])),
            Error(ErrorCode::PrefillFailed),
        ),
        row(
            "error wins over a terminal finish_reason",
            result(json!([with(
                frame(Some(json!("eos")), t.clone()),
                "error",
                json!("boom")
            )])),
            Error(ErrorCode::PrefillFailed),
        ),
        row(
            "error wins over a decode finish_reason",
            result(json!([with(
                frame(Some(json!("length")), t.clone()),
                "error",
                json!("boom")
            )])),
            Error(ErrorCode::PrefillFailed),
        ),
        // Rule 3: finished already → terminal, whatever the params say.
        row(
            "eos",
            result(json!([frame(Some(json!("eos")), t.clone())])),
            Terminal(FinishReason::Eos),
        ),
        row(
            "stop",
            result(json!([frame(Some(json!("stop")), t.clone())])),
            Terminal(FinishReason::Stop),
        ),
        row(
            "cancelled",
            result(json!([frame(Some(json!("cancelled")), t.clone())])),
            Terminal(FinishReason::Cancelled),
        ),
        row(
            "abort",
            result(json!([frame(Some(json!("abort")), t.clone())])),
            Terminal(FinishReason::Abort),
        ),
        row(
            "content_filter",
            result(json!([frame(Some(json!("content_filter")), t.clone())])),
            Terminal(FinishReason::ContentFilter),
        ),
        row(
            "\"error\" string",
            result(json!([frame(Some(json!("error")), t.clone())])),
            Terminal(FinishReason::Error),
        ),
        row(
            "{\"error\": ...}",
            result(json!([frame(
                Some(json!({"error": "kv transfer failed"})),
                t.clone()
            )])),
            Terminal(FinishReason::Error),
        ),
        row(
            "unknown string",
            result(json!([frame(
                Some(json!("a_reason_from_next_year")),
                t.clone()
            )])),
            Terminal(FinishReason::Other),
        ),
        row(
            "terminal without any params",
            result(json!([frame(Some(json!("stop")), None)])),
            Terminal(FinishReason::Stop),
        ),
        row(
            "terminal with a broken TensorRT-LLM handoff (never validated)",
            result(json!([frame(
                Some(json!("eos")),
                Some(json!({"ctx_request_id": null}))
            )])),
            Terminal(FinishReason::Eos),
        ),
        row(
            "a non-string finish_reason is not a decode reason",
            result(json!([frame(Some(json!(3)), t.clone())])),
            Terminal(FinishReason::Other),
        ),
        row(
            "a map finish_reason without error",
            result(json!([frame(Some(json!({"type": "stop"})), t.clone())])),
            Terminal(FinishReason::Other),
        ),
        row(
            "\"LENGTH\" is not \"length\"",
            result(json!([frame(Some(json!("LENGTH")), t.clone())])),
            Terminal(FinishReason::Other),
        ),
        // Rule 4/5: not finished → decode.
        row(
            "length",
            result(json!([frame(Some(json!("length")), t.clone())])),
            Decode(Backend::Trtllm),
        ),
        row(
            "null",
            result(json!([frame(Some(Json::Null), t.clone())])),
            Decode(Backend::Trtllm),
        ),
        row(
            "absent",
            result(json!([frame(None, t.clone())])),
            Decode(Backend::Trtllm),
        ),
        row(
            "not_finished",
            result(json!([frame(Some(json!("not_finished")), t.clone())])),
            Decode(Backend::Trtllm),
        ),
        row(
            "error: null is no error",
            result(json!([with(
                frame(Some(json!("length")), t.clone()),
                "error",
                Json::Null
            )])),
            Decode(Backend::Trtllm),
        ),
        // Later frames never change the outcome.
        row(
            "eos followed by an error frame",
            result(json!([frame(Some(json!("eos")), t.clone()), {"error": "late failure"}])),
            Terminal(FinishReason::Eos),
        ),
        row(
            "length followed by an error frame",
            result(json!([frame(Some(json!("length")), t.clone()), {"error": "late failure"}])),
            Decode(Backend::Trtllm),
        ),
        row(
            "length followed by an eos frame",
            result(json!([
                frame(Some(json!("length")), t.clone()),
                frame(Some(json!("eos")), None)
            ])),
            Decode(Backend::Trtllm),
        ),
        row(
            "eos followed by a length frame",
            result(json!([
                frame(Some(json!("eos")), None),
                frame(Some(json!("length")), t.clone())
            ])),
            Terminal(FinishReason::Eos),
        ),
        row(
            "empty first frame followed by a good one",
            result(json!([{}, frame(Some(json!("length")), t.clone())])),
            Error(ErrorCode::NoDisaggregatedParams),
        ),
        // Rule 4: the handoff must be there.
        row(
            "needs decode, params absent",
            result(json!([frame(Some(json!("length")), None)])),
            Error(ErrorCode::NoDisaggregatedParams),
        ),
        row(
            "needs decode, params null",
            result(json!([frame(Some(json!("length")), Some(Json::Null))])),
            Error(ErrorCode::NoDisaggregatedParams),
        ),
        row(
            "needs decode, params a string",
            result(json!([frame(None, Some(json!("ctx_request_id=7")))])),
            Error(ErrorCode::NoDisaggregatedParams),
        ),
        row(
            "needs decode, params an array",
            result(json!([frame(None, Some(json!([7])))])),
            Error(ErrorCode::NoDisaggregatedParams),
        ),
        row(
            "length first frame with ctx_request_id null",
            needs_decode(with(trt(), "ctx_request_id", Json::Null)),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        row(
            "request_type context_only without ctx_request_id",
            needs_decode(json!({"request_type": "context_only"})),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        row(
            "SGLang is not asked for ctx_request_id",
            needs_decode(sglang()),
            Decode(Backend::Sglang),
        ),
        row(
            "vLLM is not asked for ctx_request_id",
            needs_decode(vllm()),
            Decode(Backend::Vllm),
        ),
        row(
            "an opaque map is not asked for ctx_request_id",
            needs_decode(json!({"kv_handle": "abc", "engine": "custom"})),
            Decode(Backend::Opaque),
        ),
        row(
            "an empty params map is opaque",
            needs_decode(json!({})),
            Decode(Backend::Opaque),
        ),
    ];
    for (name, message, expect) in rows {
        let d = decide_json_as_msgpack(message);
        check(name, &d, expect);
    }
}

#[test]
fn malformed_results_with_a_known_reply_subject_get_an_error() {
    let good_frames = json!([frame(Some(json!("length")), Some(trt()))]);
    let long_id = "x".repeat(257);
    let rows: Vec<(&str, Json)> = vec![
        (
            "request_id missing",
            json!({"reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id null",
            json!({"request_id": null, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id an integer",
            json!({"request_id": 5, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id empty",
            json!({"request_id": "", "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id 257 bytes",
            json!({"request_id": long_id, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "frames missing",
            json!({"request_id": "req-1", "reply_to": REPLY}),
        ),
        (
            "frames null",
            json!({"request_id": "req-1", "reply_to": REPLY, "frames": null}),
        ),
        (
            "frames a map",
            json!({"request_id": "req-1", "reply_to": REPLY, "frames": {"0": {}}}),
        ),
        ("first frame not a map", result(json!(["eos"]))),
        (
            "later frame not a map",
            result(json!([frame(Some(json!("eos")), None), 5])),
        ),
        (
            "request not a map",
            with(result(good_frames.clone()), "request", json!("prompt")),
        ),
    ];
    for (name, message) in rows {
        let d = decide_json_as_msgpack(message);
        check(name, &d, Expect::Error(ErrorCode::Malformed));
    }
    let ok = decide_json_as_msgpack(with(
        result(good_frames.clone()),
        "request_id",
        json!("y".repeat(256)),
    ));
    assert!(
        matches!(ok.outcome, Outcome::Decode { .. }),
        "256 bytes is fine"
    );
    let null_request = decide_json_as_msgpack(with(result(good_frames), "request", Json::Null));
    assert!(matches!(null_request.outcome, Outcome::Decode { .. }));
}

/// Keys that appear twice could be read one way here and another way by the
/// decode worker.
#[test]
fn duplicated_keys_are_malformed() {
    let k = Value::from;
    let first_frame = |extra: Vec<(Value, Value)>| {
        let mut f = vec![(k("finish_reason"), k("length"))];
        f.push((k("disaggregated_params"), v(trt())));
        f.extend(extra);
        Value::Map(f)
    };
    let message = |frame: Value, extra: Vec<(Value, Value)>| {
        let mut m = vec![
            (k("request_id"), k("req-1")),
            (k("reply_to"), k(REPLY)),
            (k("frames"), Value::Array(vec![frame])),
        ];
        m.extend(extra);
        Value::Map(m)
    };
    let mut params = match v(trt()) {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    params.push((k("ctx_request_id"), Value::from(8)));
    let rows = [
        (
            "top level",
            message(
                first_frame(vec![]),
                vec![(k("frames"), Value::Array(vec![]))],
            ),
        ),
        (
            "first frame",
            message(first_frame(vec![(k("finish_reason"), k("eos"))]), vec![]),
        ),
        (
            "params",
            message(
                Value::Map(vec![(k("disaggregated_params"), Value::Map(params))]),
                vec![],
            ),
        ),
    ];
    for (name, m) in rows {
        check(
            name,
            &decide_msgpack(&m),
            Expect::Error(ErrorCode::Malformed),
        );
    }
    // JSON keeps duplicated keys too, so they are caught the same way.
    let json_twice =
        br#"{"request_id": "r", "reply_to": "_INBOX.a", "frames": [], "frames": [{}]}"#;
    let d = decide_bytes(json_twice, Encoding::Json, &rules(), None);
    assert_eq!(
        d.outcome,
        Outcome::Error {
            code: ErrorCode::Malformed
        }
    );
    let json_reply_twice =
        br#"{"request_id": "r", "reply_to": "_INBOX.a", "reply_to": "_INBOX.b", "frames": []}"#;
    let d = decide_bytes(json_reply_twice, Encoding::Json, &rules(), None);
    assert_eq!(d.outcome.kind(), "dead_letter");
    // A duplicated request_id: which one is meant cannot be known.
    let twice = message(first_frame(vec![]), vec![(k("request_id"), k("req-2"))]);
    let d = decide_msgpack(&twice);
    assert_eq!(d.request_id, None);
}

#[test]
fn errors_name_the_request_and_say_what_was_wrong() {
    let d = decide_json_as_msgpack(result(json!([{"error": "CUDA out of memory on GPU 3"}])));
    let b = body(&d, Encoding::MsgPack);
    let message = path(&b, &["error", "message"]).and_then(Value::as_str);
    assert!(
        message.is_some_and(|m| m.contains("CUDA out of memory on GPU 3")),
        "{message:?}"
    );
    assert_eq!(
        field(&b, "request_id").and_then(Value::as_str),
        Some("req-1")
    );
    assert_eq!(d.request_id.as_deref(), Some("req-1"));

    let d = decide_json_as_msgpack(result(
        json!([{"error": {"message": "engine died", "code": 13}}]),
    ));
    let b = body(&d, Encoding::MsgPack);
    let message = path(&b, &["error", "message"]).and_then(Value::as_str);
    assert!(
        message.is_some_and(|m| m.contains("engine died")),
        "{message:?}"
    );

    // A malformed result still carries its request_id when it had a good one.
    let d = decide_json_as_msgpack(json!({"request_id": "req-9", "reply_to": REPLY, "frames": 3}));
    let b = body(&d, Encoding::MsgPack);
    assert_eq!(
        field(&b, "request_id").and_then(Value::as_str),
        Some("req-9")
    );
    // ... and null when it had none.
    let d = decide_json_as_msgpack(json!({"reply_to": REPLY, "frames": []}));
    let b = body(&d, Encoding::MsgPack);
    assert_eq!(field(&b, "request_id"), Some(&Value::Nil));

    let d = decide_json_as_msgpack(needs_decode(with(trt(), "ctx_request_id", Json::Null)));
    let message = d.detail.unwrap_or_default();
    assert!(message.contains("ctx_request_id"), "{message}");
}

#[test]
fn terminal_outputs_keep_the_frame_but_never_the_params() {
    let first = json!({
        "token_ids": [42, 43],
        "text": "Hello",
        "finish_reason": "stop",
        "completion_usage": {"prompt_tokens": 5, "completion_tokens": 2},
        "disaggregated_params": trt(),
        "logprobs": [-0.5, -0.25],
        "a_new_upstream_field": {"nested": [1, "two"]},
    });
    let d = decide_json_as_msgpack(result(json!([first, {"error": "late"}])));
    check("stop", &d, Expect::Terminal(FinishReason::Stop));
    assert_eq!(d.trailing_frames, 1);
    let b = body(&d, Encoding::MsgPack);
    let expected = v(without(first, "disaggregated_params"));
    assert_eq!(field(&b, "output"), Some(&expected));
    // Exactly request_id, kind and output.
    assert!(matches!(&b, Value::Map(m) if m.len() == 3));
    assert_eq!(
        d.headers,
        vec![],
        "MessagePack outputs carry no Content-Type"
    );
}

#[test]
fn trailing_frames_are_counted() {
    for (frames, trailing) in [
        (json!([frame(Some(json!("eos")), None)]), 0),
        (json!([frame(Some(json!("eos")), None), {}, {}]), 2),
        (
            json!([frame(Some(json!("length")), Some(trt())), {"error": "x"}]),
            1,
        ),
        (json!([{"error": "x"}, {}, {}, {}]), 3),
    ] {
        let d = decide_json_as_msgpack(result(frames));
        assert_eq!(d.trailing_frames, trailing, "{:?}", d.outcome);
    }
}

#[test]
fn json_in_json_out_with_content_type() {
    let cases = [
        (result(json!([frame(Some(json!("eos")), None)])), "terminal"),
        (
            result(json!([frame(Some(json!("length")), Some(trt()))])),
            "decode",
        ),
        (result(json!([])), "error"),
    ];
    for (message, kind) in cases {
        let bytes = serde_json::to_vec(&message).expect("json");
        let d = decide_bytes(&bytes, Encoding::Json, &rules(), None);
        assert_eq!(d.outcome.kind(), kind);
        assert_eq!(header(&d, "Content-Type"), Some("application/json"));
        let out: Json = serde_json::from_slice(&d.payload).expect("the output is JSON");
        assert_eq!(out["request_id"], "req-1");
    }
}
